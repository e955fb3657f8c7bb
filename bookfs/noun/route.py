"""Where an event goes: the vane Arvo routes it to, and the Gall agent it names, from the
event's head (``date``, ``wire``, card ``tag``: :func:`~bookfs.noun.peek_event`) and, for
the few card shapes that need it, a look into the card through a
:class:`~bookfs.noun.view.View` (a cued noun or a jam read in place).  Pure functions.

**The vane** (:func:`vane_of`) follows Arvo's own routing of an event from outside, as
``pkg/arvo/sys/arvo.hoon`` in urbit/urbit (read at commit 02d796cd, kelvin ``%240``)
writes it:

* ``+poke`` (in ``|le``: "prepare a worklist-of-one from outside") hands the ovum
  ``[wire card]`` to ``+poke:pith``.  There an empty wire crashes (``'pith: bad wire'``:
  shown here as :data:`NO_WIRE`); the cards ``%crud``, ``%wack`` and ``%wyrd`` are
  *wasps*, taken by Arvo itself: ``%wack`` (entropy) and ``%wyrd`` (kelvin check) stay in
  Arvo (:data:`ARVO`), and ``%crud`` (an error report) is passed as a ``%hurl`` of the
  ovum it carries, ``(gest ovum.buz)``, so it goes where that inner ovum's wire says;
* every other card goes through ``+gest:pith``: ``=^  way=term  wire.ovum  wire.ovum``
  takes the wire's **first segment** as ``way``; ``%$`` (an empty first segment, the
  wire ``//...``) is "routed to arvo-proper" (``+call`` then runs ``call:pith`` with the
  card as a ``$waif``: ``%trim``, ``%what``, ``%whey``, ``%verb``, ``%whiz``), and any
  other ``way`` is passed to that vane as a ``%soft`` task;
* ``+call`` (``|le``) expands ``way`` with ``+grow`` before it picks the vane out of
  ``van.mod``: ``%a`` ames, ``%b`` behn, ``%c`` clay, ``%d`` dill, ``%e`` eyre, ``%f``
  ford, ``%g`` gall, ``%i`` iris, ``%j`` jael, ``%k`` khan; any other term is used as it
  is (``/ames/...`` goes to ames too).  So the vane shown is ``(grow way)``: a segment
  that names no vane shows as itself (Arvo would fail that event: ``%missing-vane``).

**The agent** (:func:`agent_of`) is read only from these shapes; every other event is
:data:`NO_AGENT`:

1. a wire ``/g/use/<agent>/...``: Gall's wire for what an agent asked for (a response
   coming back to ``<agent>``);
2. a ``%plea`` card, ``[%plea ship [vane path payload]]`` (ames, a peer's request),
   whose ``vane`` is ``%g`` and whose ``path`` is ``/ge/<agent>``: Gall's flow for a
   peer's poke or watch of ``<agent>``;
3. an HTTP request to eyre, ``[%request secure address [method url headers body]]``
   (or ``%request-local``), whose URL path is ``/~/scry/<agent>/...`` (a scry of
   ``<agent>``), ``/spider/...`` (a thread: ``spider``), or ``/~/channel/<id>`` with a
   JSON body (at most :data:`BODY_MAX` bytes) whose first action names ``"app"``.

A ``%crud`` card's inner ovum and the card data of rules 2 and 3 are read through a
:class:`~bookfs.noun.view.View`; an event whose card cannot be read that far counts as
``%crud`` to :data:`ARVO` and as :data:`NO_AGENT`.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from bookfs.noun.codec import CueError

__all__ = ["ARVO", "BODY_MAX", "GROW", "NO_AGENT", "NO_WIRE", "UNDATED", "agent_of",
           "card_extras", "grow", "vane_of", "wire_prefix"]

#: ``+grow`` in arvo.hoon: a vane's one-letter name to its full name.
GROW = {"a": "ames", "b": "behn", "c": "clay", "d": "dill", "e": "eyre", "f": "ford",
        "g": "gall", "i": "iris", "j": "jael", "k": "khan"}
ARVO = "arvo"  # Arvo itself: the %$ way, %wack, %wyrd, a %crud whose ovum is unreadable
NO_WIRE = "(no wire)"  # an empty wire: Arvo refuses the event ('pith: bad wire')
NO_AGENT = "(none)"
UNDATED = "(boot)"  # an event without a [date [wire card]] head: the boot's lifecycle
WASPS = frozenset({"crud", "wack", "wyrd"})
HTTP_TAGS = frozenset({"request", "request-local"})
BODY_MAX = 64 << 10  # bytes of an HTTP body read for a channel's actions
_TEXT_MAX = 4096  # bytes of an atom read as text (a knot, a URL)


def grow(way: str) -> str:
    """``+grow``: the vane a wire's first segment names."""
    return GROW.get(way, way)


def wire_prefix(wire: str | None, depth: int) -> str:
    """The wire's first ``depth`` segments, ``/a/newt``; :data:`UNDATED` for no wire."""
    if wire is None:
        return UNDATED
    if wire == "/":
        return "/"
    return "/" + "/".join(wire[1:].split("/")[:depth])


def vane_of(wire: str | None, tag: str | None, crud_wire: str | None = None) -> str:
    """The vane Arvo routes the event ``[wire [tag ...]]`` to (module docstring);
    ``crud_wire``: the wire of the ovum a ``%crud`` carries, where it could be read.
    :data:`UNDATED` for an event without a head."""
    if wire is None:
        return UNDATED
    if wire == "/":
        return NO_WIRE
    if tag in WASPS:
        if tag == "crud" and crud_wire is not None:
            return vane_of(crud_wire, None)
        return ARVO
    way = wire[1:].split("/", 1)[0]
    return ARVO if way == "" else grow(way)


def agent_of(wire: str | None, tag: str | None, extras: dict | None = None) -> str:
    """The Gall agent the event names by the module docstring's rules, else
    :data:`NO_AGENT`; ``extras``: :func:`card_extras`' look into the card."""
    if wire is None:
        return NO_AGENT
    parts = wire[1:].split("/")
    if len(parts) >= 3 and parts[0] == "g" and parts[1] == "use" and parts[2]:
        return parts[2]
    return (extras or {}).get("agent") or NO_AGENT


# --- a look into the card ------------------------------------------------------------------


def _text(view, node) -> str | None:
    if view.is_cell(node):
        return None
    value = view.atom(node)
    if not isinstance(value, int) or value.bit_length() > 8 * _TEXT_MAX:
        return None
    try:
        return value.to_bytes((value.bit_length() + 7) // 8, "little").decode("utf-8")
    except UnicodeDecodeError:
        return None


def _path(view, node, most: int = 8) -> list[str] | None:
    """The knots of the path at ``node`` (a list ending in ``~``), at most ``most``."""
    out = []
    while view.is_cell(node):
        knot = _text(view, view.head(node))
        if knot is None or len(out) >= most:
            return None
        out.append(knot)
        node = view.tail(node)
    return out if view.atom(node) == 0 else None


def _nth(view, node, n: int):
    """The ``n``-th item of the tuple at ``node`` (0 is its head); None past its end."""
    for _ in range(n):
        if not view.is_cell(node):
            return None
        node = view.tail(node)
    return view.head(node) if view.is_cell(node) else None


def _rest(view, node, n: int):
    """``node`` after ``n`` tails, or None."""
    for _ in range(n):
        if not view.is_cell(node):
            return None
        node = view.tail(node)
    return node


def _plea_agent(view, card) -> str | None:
    plea = _rest(view, card, 2)  # [%plea ship [vane path payload]]
    if plea is None or not view.is_cell(plea):
        return None
    if _text(view, view.head(plea)) != "g":
        return None
    path = _path(view, _nth(view, plea, 1)) if view.is_cell(view.tail(plea)) else None
    if path and len(path) >= 2 and path[0] == "ge" and path[1]:
        return path[1]
    return None


def _http_agent(view, card) -> str | None:
    request = _rest(view, card, 3)  # [%request secure address [method url headers body]]
    if request is None or not view.is_cell(request):
        return None
    url = _nth(view, request, 1)
    url = _text(view, url) if url is not None else None
    if not url:
        return None
    parts = urlsplit(url).path.split("/")
    if len(parts) > 3 and parts[1] == "~" and parts[2] == "scry" and parts[3]:
        return parts[3].split(".")[0]
    if len(parts) > 1 and parts[1] == "spider":
        return "spider"
    if len(parts) > 3 and parts[1] == "~" and parts[2] == "channel":
        body = _rest(view, request, 3)  # (unit octs): [0 [length data]]
        if body is None or not view.is_cell(body):
            return None
        octs = view.tail(body)
        if not view.is_cell(octs):
            return None
        data = view.atom(view.tail(octs)) if not view.is_cell(view.tail(octs)) else None
        if not isinstance(data, int) or data.bit_length() > 8 * BODY_MAX:
            return None
        try:
            actions = json.loads(data.to_bytes((data.bit_length() + 7) // 8, "little"))
        except ValueError:
            return None
        first = actions[0] if isinstance(actions, list) and actions else None
        app = first.get("app") if isinstance(first, dict) else None
        return app if isinstance(app, str) and app else None
    return None


def card_extras(view, root, tag: str | None, *, agent: bool, crud: bool) -> dict:
    """What :func:`vane_of` and :func:`agent_of` need from inside the card of the event
    whose noun is ``root`` in ``view`` (``[date [wire card]]``): ``{"crud_wire": ...}``
    for a ``%crud`` (when ``crud``), ``{"agent": ...}`` for a ``%plea`` or an HTTP
    request (when ``agent``).  Parts that cannot be read (a jam cut short, a shape
    that is not the one expected) are left out, never an error."""
    out: dict = {}
    if not ((crud and tag == "crud") or (agent and (tag == "plea" or tag in HTTP_TAGS))):
        return out
    try:
        card = _rest(view, view.tail(root), 1)  # [date [wire card]] -> card
        if card is None or not view.is_cell(card):
            return out
        if tag == "crud":
            goof = _nth(view, card, 1)  # [%crud [mote tang] ovum]
            ovum = _rest(view, card, 2)
            if (goof is not None and view.is_cell(goof) and ovum is not None
                    and view.is_cell(ovum)):
                wire = _path(view, view.head(ovum), most=64)
                if wire is not None:
                    out["crud_wire"] = "/" + "/".join(wire)
        elif tag == "plea":
            out["agent"] = _plea_agent(view, card)
        else:
            out["agent"] = _http_agent(view, card)
    except (CueError, RecursionError, ValueError, IndexError, TypeError, KeyError):
        pass
    except Exception as e:  # the view's skip budget (view.Exhausted)
        if type(e).__name__ != "Exhausted":
            raise
    return out
