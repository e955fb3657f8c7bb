"""Is ``spark://HOST:PORT`` a Spark master?  Told by what the port answers, in milliseconds,
before Spark starts (pyspark is not imported here).

:func:`check_master` sends each address of the URL one request of Spark's own network
protocol and accepts the address when the answer is framed as only a Spark RPC server
frames it.  The facts it relies on, in Spark's source (apache/spark):

* The frame (``common/network-common/.../protocol/MessageEncoder.java``, ``encode``): an
  8-byte big-endian frame length that counts itself, a 1-byte message type
  (``Message.Type``: ``RpcRequest`` 3, ``RpcResponse`` 4, ``RpcFailure`` 5), then the
  message: ``RpcRequest.encode`` writes an 8-byte request id and the 4-byte body size, and
  the body follows; ``RpcResponse`` and ``RpcFailure`` begin with the same request id
  (``RpcFailure.encode``: the id, then the error as a 4-byte length and UTF-8).
* The body of an RPC to an endpoint (``core/.../rpc/netty/NettyRpcEnv.scala``,
  ``RequestMessage.serialize`` and ``RequestMessage.apply``): the sender's address
  (``writeBoolean(false)``: none, a client), the receiver's address (``writeBoolean(true)``,
  ``writeUTF(host)``, ``writeInt(port)``), ``writeUTF(endpoint name)``, then the content,
  Java-serialized (``JavaSerializer``; here a ``String``: ``AC ED 00 05``, ``TC_STRING``).
* The answer (``NettyRpcHandler.receive`` → ``Dispatcher.postRemoteMessage`` →
  ``Dispatcher.postMessage``).  The probe asks for the endpoint ``Worker``
  (``Worker.ENDPOINT_NAME``).  A master has none: ``postMessage`` fails at once with
  ``SparkException("Could not find Worker.")``, which
  ``TransportRequestHandler.processRpcRequest`` sends back as an ``RpcFailure`` (type 5)
  with our request id.  That is answered by the network thread itself (the endpoints'
  message loops are not involved, so a busy master answers as fast) and logs nothing;
  the connection shows in the master's log as one INFO line ("... got disassociated"),
  as every client's does.  A worker has the endpoint: the message reaches it, which
  does not know it, and the failure comes back as an ``RpcResponse`` (type 4) holding a
  serialized ``RpcFailure`` (``NettyRpcCallContext.sendFailure`` sends it as a reply;
  the worker logs one ERROR, "Unsupported message"), so a worker's port, given by
  mistake, is refused too.  With ``spark.authenticate`` on, the request is refused by
  ``AuthRpcHandler.doAuthChallenge`` (or the SASL handler it falls back to), still as an
  ``RpcFailure`` with our id: accepted, Spark then authenticates for real.

A reply whose first 17 bytes are a plausible frame length, type 4 or 5 and the random
64-bit request id we sent can only come from a Spark RPC server; a web server (the
master's UI, 8080, or its REST server, ``StandaloneRestServer``, 6066: both HTTP), any
other server, or a port that takes the connection and says nothing does not give one.
The content string ends in an empty line, so that an HTTP server that reads lines answers
(``400``) at once instead of waiting for more.

Why not something else: the REST server (``StandaloneRestServer``, answering
``GET /v1/submissions/status/<id>`` with JSON) can be turned off
(``spark.master.rest.enabled``) and, like the web UI's ``/json/``, listens on a port of
its own, not the URL's: either would need the user to name a second port; asking the endpoint verifier ``CheckExistence("Master")``
(``RpcEndpointVerifier``, what Spark's own ``StandaloneAppClient`` does) needs that Scala
class's Java serialization, whose ``serialVersionUID`` the compiler derives and which
differs between Spark's Scala 2.12 and 2.13 builds; and sending anything to the
``Master`` endpoint itself makes the master log an ERROR ("Unsupported message").  So
the probe proves "a Spark RPC server that is not a worker" (a master; by mistake, a
driver's RPC port, random unless configured, would pass too); whether it registers this
run is then Spark's own business, which ``bookfs spark`` waits for with no timer of its
own (:func:`bookfs.spark.cli.run`; Spark's ``StandaloneAppClient`` gives up after 3
tries of 20 s).  Not covered: RPC over TLS (``spark.ssl.rpc.enabled``,
Spark 4), which closes our plain connection, so such a master is refused.
"""

from __future__ import annotations

import os
import socket
import struct
import time

#: Seconds each ``spark://`` address has by default to connect and answer the probe
#: (``bookfs spark --master-timeout``).  A master answers from its network thread within
#: milliseconds, even on a loaded machine.
MASTER_TIMEOUT = 5.0
#: The endpoint the probe asks for: a worker's (``Worker.ENDPOINT_NAME``), which a master
#: does not have.
PROBE_ENDPOINT = "Worker"
#: What the probe sends as the RPC's content (a Java ``String``): the empty line makes a
#: line-reading HTTP server answer at once.
PROBE_CONTENT = "bookfs: is this a Spark master?\r\n\r\n"
_RPC_REQUEST, _RPC_RESPONSE, _RPC_FAILURE = 3, 4, 5
#: frame length (8), type (1), request id (8): what an answer must begin with
_HEAD = 17
#: The largest answer frame taken as Spark's: a failure carries a Java stack trace (a few
#: KiB); far more is not an answer to this request.
_MAX_FRAME = 1 << 24


def _utf(text: str) -> bytes:
    """``DataOutputStream.writeUTF`` (2-byte length; modified UTF-8 equals UTF-8 for text
    without NUL or characters beyond the BMP, as host names and our strings are)."""
    data = text.encode()
    return struct.pack(">H", len(data)) + data


def probe_frame(host: str, port: int, request_id: int) -> bytes:
    """The ``RpcRequest`` frame the probe sends to ``host:port`` (see the module
    docstring for each field's source)."""
    body = (b"\x00"                                         # sender: none (a client)
            + b"\x01" + _utf(host) + struct.pack(">i", port)  # receiver's address
            + _utf(PROBE_ENDPOINT)                          # receiver's endpoint name
            + b"\xac\xed\x00\x05" + b"\x74" + _utf(PROBE_CONTENT))  # a serialized String
    head = struct.pack(">qbqi", 8 + 1 + 8 + 4 + len(body), _RPC_REQUEST, request_id,
                       len(body))
    return head + body


def spark_answer(data: bytes, request_id: int) -> bool | None:
    """Whether the bytes received so far begin a Spark RPC answer to ``request_id``:
    True once its first 17 bytes are (a frame length in range, type ``RpcResponse`` or
    ``RpcFailure``, our id), False as soon as a byte contradicts that, None while too
    few have come to tell."""
    ours = struct.pack(">q", request_id)
    if len(data) >= 8:
        (length,) = struct.unpack(">q", data[:8])
        if not _HEAD <= length <= _MAX_FRAME:
            return False
    elif data and data[0] != 0:  # a length under 2**56: its first byte is 0
        return False
    if len(data) >= 9 and data[8] not in (_RPC_RESPONSE, _RPC_FAILURE):
        return False
    if len(data) > 9 and data[9:_HEAD] != ours[:len(data) - 9]:
        return False
    return True if len(data) >= _HEAD else None


def _shown(data: bytes) -> str:
    """What a non-Spark answer was, for the one-line error."""
    if data.startswith(b"HTTP/") or data.lower().startswith((b"<!doctype", b"<html")):
        # (an HTTP/0.9 answer, to a request line without a version, has no status line)
        return "an HTTP server answered (a web UI or REST port?), not Spark's RPC"
    if data.startswith((b"\x15\x03", b"\x16\x03")):
        return "a TLS server answered, not Spark's plain RPC"
    return f"answered {data[:16]!r}, which is not Spark's RPC protocol"


def _drain(sock: socket.socket, left: int, deadline: float) -> None:
    """Read and drop the ``left`` bytes of the answer still to come, until ``deadline``
    (so that our close is an orderly one, not a reset that the master logs as a WARN)."""
    try:
        while left > 0 and (wait := deadline - time.monotonic()) > 0:
            sock.settimeout(wait)
            chunk = sock.recv(min(left, 1 << 16))
            if not chunk:
                return
            left -= len(chunk)
    except OSError:
        pass  # the answer was had: how the rest goes does not matter


def _receive(sock: socket.socket, request_id: int, deadline: float, data: bytearray) -> bool:
    """Read into ``data`` until the answer is known to be Spark's or not
    (:func:`spark_answer`), the peer closes, or ``deadline`` (TimeoutError); returns
    whether it is Spark's."""
    while (verdict := spark_answer(bytes(data), request_id)) is None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        chunk = sock.recv(_HEAD - len(data))
        if not chunk:
            break
        data += chunk
    return bool(verdict)


def probe(host: str, port: int, timeout: float = MASTER_TIMEOUT) -> str | None:
    """Send one probe to ``host:port``; None if a Spark RPC server answered it within
    ``timeout`` seconds (connecting included), else why not, as a phrase for the
    one-line error (the connection's error, no answer, or what answered instead)."""
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except TimeoutError:
        return f"no connection within {timeout:g} s"
    except OSError as e:
        return e.strerror or str(e)
    request_id = int.from_bytes(os.urandom(8), "big") >> 1  # positive, random
    data = bytearray()
    with sock:
        try:
            sock.sendall(probe_frame(host, port, request_id))
            spark = _receive(sock, request_id, deadline, data)
        except TimeoutError:
            if spark_answer(bytes(data), request_id) is False:  # a wrong answer, then silence
                return _shown(bytes(data))
            return (f"accepted a connection but sent no answer in {timeout:g} s (a master "
                    "too busy to answer gets longer with --master-timeout)")
        except (ConnectionResetError, BrokenPipeError):  # closed, before or after our request
            spark = False
        except OSError as e:
            return f"accepted a connection, then {e.strerror or e}"
        if spark:
            _drain(sock, struct.unpack(">q", data[:8])[0] - len(data), deadline)
            if data[8] == _RPC_RESPONSE:  # it has an endpoint named Worker
                return "a Spark worker's RPC port, not a master's"
            return None
    if not data:
        return "accepted a connection and closed it without an answer"
    return _shown(bytes(data))


def check_master(master: str, timeout: float = MASTER_TIMEOUT) -> None:
    """A ``spark://HOST:PORT[,HOST:PORT...]`` master must answer :func:`probe` on one of
    its addresses (each has ``timeout`` seconds, connecting included): else
    :class:`bookfs.errors.UsageError` in one line naming what each address did, before
    Spark starts (whose own client would retry for a minute, then print a Java stack
    trace).  Other masters (``local[N]``, ``local-cluster[...]``) need no check."""
    from bookfs.errors import UsageError

    if not master.startswith("spark://"):
        return
    failures = []
    for address in master[len("spark://"):].split(","):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise UsageError(f"--master {master}: expected spark://HOST:PORT")
        why = probe(host.strip("[]"), int(port), timeout)
        if why is None:
            return
        failures.append(f"{address}: {why}")
    raise UsageError(f"--master {master}: no Spark master answers ({'; '.join(failures)}); "
                     "expected a running master's RPC port (7077 by default; not its web "
                     "UI's 8080 nor its REST port 6066): docs/cluster.md")
