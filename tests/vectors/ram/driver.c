/* driver.c: golden vectors of vere's "ram" noun encoding, made by vere's own code.
**
**   Built by make_vectors.sh against pkg/noun/serial.c (and the parts of
**   pkg/noun, pkg/ur and pkg/c3 it needs) of urbit/vere commit 125ac225
**   ("noun: adds ram/tap reference-aware serialization", branch ml/bob).
**
**   For each noun it writes one JSON object to the file named by argv[1]:
**
**     name      a short label
**     noun      the noun: an atom is a decimal string, a cell [head, tail];
**               bob atoms appear materialised (their file's bytes as an atom)
**     noun_ref  (only when the noun holds bob atoms) the same noun with each
**               bob atom as {"bob": [mug, seq]}
**     jam       u3s_jam_xeno(noun), hex
**     ram       u3s_ram_xeno(noun), hex (5-byte "RAM\0" 0x01 header included)
**     mug       u3r_mug(noun)
**     tap_ok    whether u3s_tap_xeno(ram) decodes back to an equal noun
**     bobs      (only with bob atoms) [{mug, seq, hex}]: the bob files
**
**   Bob files are written under a temporary pier ($TMPDIR/ram-vectors-XXXXXX/
**   .urb/bob/<mug>/<seq>, the layout of pkg/vere/blob.c u3_blob_path), with
**   <mug> = u3r_mug_bytes(file bytes), as pkg/vere/blob.c _blob_mug computes it
**   for files under 4 GiB.  u3C.dir_c points at that pier, which is all that
**   u3r_blob_met / u3r_blob_map (used by ram and jam) need.  The encoder does
**   not look at the size of a bob: small files make honest bob atoms.
*/
#include "noun.h"

#include <gmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <sys/wait.h>

static c3_c _pier_c[1024];
static FILE* _out_u;   //  the JSON output (argv[1]); vere logs to stdout

/* _hex(): print [len_d] bytes as lowercase hex.
*/
static void
_hex(FILE* fil_u, c3_d len_d, const c3_y* byt_y)
{
  for ( c3_d i_d = 0; i_d < len_d; i_d++ ) {
    fprintf(fil_u, "%02x", byt_y[i_d]);
  }
}

/* _atom_dec(): print an atom (bob atoms materialised) as a decimal string.
*/
static void
_atom_dec(FILE* fil_u, u3_atom a)
{
  c3_w  len_w = u3r_met(3, a);
  c3_y* byt_y = c3_calloc(len_w ? len_w : 1);
  mpz_t mp;
  c3_c* str_c;

  u3r_bytes(0, len_w, byt_y, a);
  mpz_init(mp);
  mpz_import(mp, len_w, -1, 1, 0, 0, byt_y);
  str_c = mpz_get_str(0, 10, mp);
  fprintf(fil_u, "\"%s\"", str_c);
  //  gmp allocates through u3a_malloc (u3m_init sets that up)
  //
  u3a_free(str_c);
  mpz_clear(mp);
  c3_free(byt_y);
}

/* _noun_json(): print a noun; [ref_o]: bob atoms as {"bob": [mug, seq]}.
*/
static void
_noun_json(FILE* fil_u, u3_noun a, c3_o ref_o)
{
  if ( c3y == u3a_is_cell(a) ) {
    fputc('[', fil_u);
    _noun_json(fil_u, u3h(a), ref_o);
    fputc(',', fil_u);
    _noun_json(fil_u, u3t(a), ref_o);
    fputc(']', fil_u);
  }
  else if ( (c3y == ref_o) && (c3y == u3a_is_bob(a)) ) {
    fprintf(fil_u, "{\"bob\":[%u,%u]}",
            (unsigned)u3a_bob_mug(a), (unsigned)u3a_bob_seq(a));
  }
  else {
    _atom_dec(fil_u, a);
  }
}

/* _has_bob(): does [a] hold a bob atom?
*/
static c3_o
_has_bob(u3_noun a)
{
  if ( c3y == u3a_is_cell(a) ) {
    return c3o(_has_bob(u3h(a)), _has_bob(u3t(a)));
  }
  return ( c3y == u3a_is_cat(a) ) ? c3n : u3a_is_bob(a);
}

/* bob files made so far (for the "bobs" field).
*/
typedef struct { c3_h mug_h; c3_h seq_h; c3_d len_d; c3_y* dat_y; } _bob_t;
static _bob_t _bobs_u[16];
static c3_w   _bobs_w = 0;

/* _make_bob(): write a bob file for [dat_y] and return a bob atom for it.
*/
static u3_atom
_make_bob(c3_h seq_h, const c3_y* dat_y, c3_d len_d)
{
  c3_h mug_h = u3r_mug_bytes(dat_y, (c3_h)len_d);
  c3_c pax_c[2048];
  FILE* fil_u;

  snprintf(pax_c, sizeof(pax_c), "%s/.urb/bob/%u", _pier_c, (unsigned)mug_h);
  mkdir(pax_c, 0700);
  snprintf(pax_c, sizeof(pax_c), "%s/.urb/bob/%u/%u",
           _pier_c, (unsigned)mug_h, (unsigned)seq_h);
  if ( !(fil_u = fopen(pax_c, "wb")) || (len_d != fwrite(dat_y, 1, len_d, fil_u)) ) {
    fprintf(stderr, "driver: cannot write %s\n", pax_c);
    exit(1);
  }
  fclose(fil_u);

  _bobs_u[_bobs_w].mug_h = mug_h;
  _bobs_u[_bobs_w].seq_h = seq_h;
  _bobs_u[_bobs_w].len_d = len_d;
  _bobs_u[_bobs_w].dat_y = c3_malloc(len_d);
  memcpy(_bobs_u[_bobs_w].dat_y, dat_y, len_d);
  _bobs_w++;

  return u3i_blob(mug_h, seq_h);
}

static c3_o _first_o = c3y;

/* _emit(): write one vector; RETAIN [a].
*/
static void
_emit(const c3_c* nam_c, u3_noun a)
{
  c3_d  jam_d, ram_d;
  c3_y *jam_y, *ram_y;
  c3_o  bob_o = _has_bob(a);
  u3_weak out;

  u3s_jam_xeno(a, &jam_d, &jam_y);
  u3s_ram_xeno(a, &ram_d, &ram_y);
  out = u3s_tap_xeno(ram_d, ram_y);

  fprintf(_out_u, "%s\n  {\"name\": \"%s\",\n   \"noun\": ", (c3y == _first_o) ? "" : ",", nam_c);
  _first_o = c3n;
  _noun_json(_out_u, a, c3n);
  if ( c3y == bob_o ) {
    fprintf(_out_u, ",\n   \"noun_ref\": ");
    _noun_json(_out_u, a, c3y);
  }
  fprintf(_out_u, ",\n   \"jam\": \"");
  _hex(_out_u, jam_d, jam_y);
  fprintf(_out_u, "\",\n   \"ram\": \"");
  _hex(_out_u, ram_d, ram_y);
  fprintf(_out_u, "\",\n   \"mug\": %u,\n   \"tap_ok\": %s",
         (unsigned)u3r_mug(a),
         ( (u3_none != out) && (c3y == u3r_sing(a, out)) ) ? "true" : "false");

  if ( c3y == bob_o ) {
    fprintf(_out_u, ",\n   \"bobs\": [");
    for ( c3_w i_w = 0; i_w < _bobs_w; i_w++ ) {
      fprintf(_out_u, "%s{\"mug\": %u, \"seq\": %u, \"hex\": \"", i_w ? ", " : "",
             (unsigned)_bobs_u[i_w].mug_h, (unsigned)_bobs_u[i_w].seq_h);
      _hex(_out_u, _bobs_u[i_w].len_d, _bobs_u[i_w].dat_y);
      fprintf(_out_u, "\"}");
    }
    fprintf(_out_u, "]");
  }
  fprintf(_out_u, "}");

  if ( u3_none != out ) u3z(out);
  free(jam_y);
  free(ram_y);
}

/* _tap_child(): u3s_tap_xeno([len_d] bytes) in a forked child, printed to [fil_u]:
**   null if it returns u3_none, "crash" if the child dies (a bail, an
**   allocation the loom cannot hold, 10 s of work), else the noun with bob
**   atoms as {"bob": [mug, seq]}.  The child keeps a mutated input's damage
**   (huge atoms, loom exhaustion) away from the parent's loom.
*/
static void
_tap_child(FILE* fil_u, c3_d len_d, const c3_y* byt_y)
{
  c3_i pip_i[2];
  pid_t pid;

  fflush(fil_u);
  fflush(stdout);
  if ( 0 != pipe(pip_i) ) { perror("pipe"); exit(1); }
  if ( 0 == (pid = fork()) ) {
    FILE* out_u = fdopen(pip_i[1], "w");
    close(pip_i[0]);
    alarm(10);
    u3_weak som = u3s_tap_xeno(len_d, byt_y);
    if ( u3_none == som ) {
      fprintf(out_u, "null");
    }
    else {
      _noun_json(out_u, som, c3y);
    }
    fflush(out_u);
    _exit(0);
  }
  close(pip_i[1]);
  {
    c3_c*  buf_c = 0;
    size_t siz_i = 0;
    FILE*  mem_u = open_memstream(&buf_c, &siz_i);
    c3_c   tmp_c[4096];
    ssize_t red_i;
    c3_i   sat_i;

    while ( 0 < (red_i = read(pip_i[0], tmp_c, sizeof(tmp_c))) ) {
      fwrite(tmp_c, 1, red_i, mem_u);
    }
    close(pip_i[0]);
    fclose(mem_u);
    waitpid(pid, &sat_i, 0);
    if ( !WIFEXITED(sat_i) || (0 != WEXITSTATUS(sat_i)) || !siz_i ) {
      fprintf(fil_u, "\"crash\"");
    }
    else {
      fwrite(buf_c, 1, siz_i, fil_u);
    }
    free(buf_c);
  }
}

/* _mutate(): vere's verdict on every one-bit flip of the ram bits (the
**   header's 40 bits are left alone) and every truncation of a vector.
*/
static void
_mutate(const c3_c* nam_c, u3_noun a, c3_o fir_o)
{
  c3_d  ram_d;
  c3_y* ram_y;

  u3s_ram_xeno(a, &ram_d, &ram_y);
  fprintf(_out_u, "%s\n  {\"name\": \"%s\",\n   \"flips\": [", (c3y == fir_o) ? "" : ",", nam_c);
  for ( c3_d i_d = 40; i_d < 8 * ram_d; i_d++ ) {
    ram_y[i_d >> 3] ^= (c3_y)(1 << (i_d & 7));
    if ( i_d > 40 ) fprintf(_out_u, ", ");
    _tap_child(_out_u, ram_d, ram_y);
    ram_y[i_d >> 3] ^= (c3_y)(1 << (i_d & 7));
  }
  fprintf(_out_u, "],\n   \"truncations\": [");
  for ( c3_d len_d = 5; len_d < ram_d; len_d++ ) {
    if ( len_d > 5 ) fprintf(_out_u, ", ");
    _tap_child(_out_u, len_d, ram_y);
  }
  fprintf(_out_u, "]}");
  free(ram_y);
}

/* _big(): a deterministic atom of [len_w] bytes (top byte nonzero).
*/
static u3_atom
_big(c3_w len_w, c3_w sed_w)
{
  c3_y* byt_y = c3_malloc(len_w);
  for ( c3_w i_w = 0; i_w < len_w; i_w++ ) {
    byt_y[i_w] = (c3_y)((i_w * 131u) + sed_w);
  }
  byt_y[len_w - 1] |= 0x80;
  u3_atom pro = u3i_bytes(len_w, byt_y);
  c3_free(byt_y);
  return pro;
}

static u3_noun
_list(c3_w len_w, const c3_w* val_w)
{
  u3_noun pro = u3_nul;
  while ( len_w-- ) {
    pro = u3nc(u3i_word(val_w[len_w]), pro);
  }
  return pro;
}

int
main(int argc, char* argv[])
{
  if ( (argc != 2) || !(_out_u = fopen(argv[1], "w")) ) {
    fprintf(stderr, "usage: driver OUT.json\n");
    return 1;
  }

  //  the loom, as u3m_boot_lite() makes it, minus the jet system (u3j_boot)
  //  and the guard page (u3e_init), which ram/jam/mug never touch
  //
  u3m_init((size_t)1 << 26);
  u3C.slog_f = 0;
  u3C.sign_hold_f = 0;
  u3C.sign_move_f = 0;
  u3t_init();
  u3m_pave(c3y);
  memset(u3A, 0, sizeof(*u3A));

  //  a scratch pier for bob files
  //
  {
    const c3_c* tmp_c = getenv("TMPDIR");
    c3_c pax_c[2048];
    snprintf(_pier_c, sizeof(_pier_c), "%s/ram-vectors-XXXXXX", tmp_c ? tmp_c : "/tmp");
    if ( !mkdtemp(_pier_c) ) { perror("mkdtemp"); return 1; }
    snprintf(pax_c, sizeof(pax_c), "%s/.urb", _pier_c);
    mkdir(pax_c, 0700);
    snprintf(pax_c, sizeof(pax_c), "%s/.urb/bob", _pier_c);
    mkdir(pax_c, 0700);
    u3C.dir_c = _pier_c;
  }

  fprintf(_out_u, "{\"vere_commit\": \"125ac225d09d94e7d2c1d7bee9e0369e6013dfb3\",\n"
         " \"made_by\": \"tests/vectors/ram/make_vectors.sh (driver.c)\",\n"
         " \"vectors\": [");

  //  atoms
  //
  { u3_noun a = 0;  _emit("atom 0", a); }
  { u3_noun a = 1;  _emit("atom 1", a); }
  { u3_noun a = 2;  _emit("atom 2", a); }
  { u3_noun a = 42; _emit("atom 42", a); }
  { u3_noun a = c3__fast; _emit("cord %fast", a); }
  { u3_noun a = 0x7fffffff; _emit("atom 2^31-1", a); }
  { u3_noun a = u3i_word(0x80000000); _emit("atom 2^31", a); u3z(a); }
  { c3_d d_d[2] = {0, 1}; u3_noun a = u3i_chubs(2, d_d); _emit("atom 2^64", a); u3z(a); }
  { u3_noun a = u3i_chub(0xffffffffffffffffULL); _emit("atom 2^64-1", a); u3z(a); }
  { u3_noun a = _big(3000, 7); _emit("atom 3000 bytes", a); u3z(a); }

  //  cells
  //
  { u3_noun a = u3nc(0, 0); _emit("[0 0]", a); u3z(a); }
  { u3_noun a = u3nc(7, 7); _emit("[7 7]", a); u3z(a); }
  { u3_noun a = u3nc(1, 2); _emit("[1 2]", a); u3z(a); }
  { u3_noun a = u3nt(1, 2, 3); _emit("[1 2 3]", a); u3z(a); }
  { u3_noun a = u3nc(u3nc(1, 2), 3); _emit("[[1 2] 3]", a); u3z(a); }
  { c3_d d_d[2] = {0, 1};
    u3_noun b = u3i_chubs(2, d_d);
    u3_noun a = u3nc(u3k(b), b);
    _emit("[2^64 2^64] same atom", a); u3z(a); }
  { u3_noun b = _big(3000, 7);
    u3_noun a = u3nc(u3k(b), b);
    _emit("[big big] same atom", a); u3z(a); }
  { u3_noun a = u3nc(_big(3000, 7), _big(3000, 7));
    _emit("[big big] equal atoms", a); u3z(a); }
  { u3_noun a = u3nt(_big(40, 1), _big(40, 2), _big(40, 1));
    _emit("[b1 b2 b1]", a); u3z(a); }

  //  shared subtrees: back-references to cells
  //
  { u3_noun s = u3nc(1, 2);
    u3_noun a = u3nc(u3k(s), s);
    _emit("[[1 2] [1 2]]", a); u3z(a); }
  { u3_noun a = u3nc(u3nc(1, 2), u3nc(1, 2));
    _emit("[[1 2] [1 2]] equal cells", a); u3z(a); }
  { u3_noun s = u3nt(u3nc(1, 2), 3, 4);
    u3_noun a = u3nt(u3k(s), u3k(s), s);
    _emit("[s s s] s=[[1 2] 3 4]", a); u3z(a); }
  { u3_noun s = u3nc(c3__fast, _big(20, 9));
    u3_noun t = u3nc(u3k(s), u3k(s));
    u3_noun a = u3nq(u3k(t), u3k(s), t, u3nc(u3k(s), s));
    _emit("nested shares", a); u3z(a); }

  //  lists
  //
  { c3_w v_w[5] = {1, 2, 3, 4, 5};
    u3_noun a = _list(5, v_w); _emit("~[1 2 3 4 5]", a); u3z(a); }
  { c3_w v_w[5] = {'h', 'e', 'l', 'l', 'o'};
    u3_noun a = _list(5, v_w); _emit("tape hello", a); u3z(a); }
  { c3_w v_w[200];
    for ( c3_w i_w = 0; i_w < 200; i_w++ ) v_w[i_w] = i_w * 2654435761u;
    u3_noun a = _list(200, v_w); _emit("list of 200 words", a); u3z(a); }
  { c3_d d_d[2] = {0x123456789abcdefULL, 0x5};
    u3_noun b = u3i_chubs(2, d_d);
    u3_noun a = u3_nul;
    for ( c3_w i_w = 0; i_w < 50; i_w++ ) a = u3nc(u3k(b), a);
    u3z(b);
    _emit("list of 50 equal 67-bit atoms", a); u3z(a); }

  //  an event-shaped noun: [now [wire card]]
  //
  { c3_d now_d[2] = {0x1234567890abcdefULL, 0x8000000cce9e0d80ULL};
    u3_noun now = u3i_chubs(2, now_d);
    u3_noun wir = u3nq(c3__d, c3__term, '1', u3_nul);
    u3_noun cad = u3nt(c3__belt, c3__txt, u3nt('h', 'i', u3_nul));
    u3_noun a = u3nc(now, u3nc(wir, cad));
    _emit("ovum [now /d/term/1 %belt %txt tape-hi]", a); u3z(a); }

  //  bob atoms (references to .urb/bob/<mug>/<seq> files)
  //
  const c3_y one_y[] = "blob contents one";
  const c3_y two_y[] = "a different blob payload";
  u3_atom b1 = _make_bob(1, one_y, sizeof(one_y) - 1);
  u3_atom b2 = _make_bob(2, two_y, sizeof(two_y) - 1);
  {
    const c3_y zed_y[] = {'z', 'e', 'd', 0, 0, 0};

    { u3_noun a = u3k(b1); _emit("bob alone", a); u3z(a); }
    { u3_noun a = u3nt(42, u3k(b1), 99); _emit("[42 bob 99]", a); u3z(a); }
    { u3_noun a = u3nt(u3k(b2), u3k(b2), u3k(b2)); _emit("[bob bob bob]", a); u3z(a); }
    { u3_noun a = u3nq(c3__blob, u3nc(u3k(b1), u3k(b2)), u3k(b1), 42);
      _emit("[%blob [bob1 bob2] bob1 42]", a); u3z(a); }
    { u3_noun a = u3nc(u3k(b1), u3i_bytes(sizeof(one_y) - 1, one_y));
      _emit("[bob atom-equal-to-bob]", a); u3z(a); }
    { u3_noun a = u3nc(u3i_bytes(sizeof(one_y) - 1, one_y), u3k(b1));
      _emit("[atom-equal-to-bob bob]", a); u3z(a); }
    { u3_atom bz = _make_bob(1, zed_y, sizeof(zed_y));
      u3_noun a = u3nc(7, bz);
      _emit("[7 bob-with-trailing-zero-bytes]", a); u3z(a); }

  }

  //  vere's own decoder (u3s_tap_xeno) on damaged copies of a few vectors:
  //  every one-bit flip after the header, every truncation
  //
  fprintf(_out_u, "\n ],\n \"mutations\": [");
  { u3_noun a = u3nt(1, 2, 3); _mutate("[1 2 3]", a, c3y); u3z(a); }
  { u3_noun a = u3nc(u3nc(1, 2), u3nc(1, 2));
    _mutate("[[1 2] [1 2]] equal cells", a, c3n); u3z(a); }
  { u3_noun s = u3nt(u3nc(1, 2), 3, 4);
    u3_noun a = u3nt(u3k(s), u3k(s), s);
    _mutate("[s s s] s=[[1 2] 3 4]", a, c3n); u3z(a); }
  { c3_w v_w[5] = {1, 2, 3, 4, 5};
    u3_noun a = _list(5, v_w); _mutate("~[1 2 3 4 5]", a, c3n); u3z(a); }
  { c3_d d_d[2] = {0, 1};
    u3_noun b = u3i_chubs(2, d_d);
    u3_noun a = u3nc(u3k(b), b);
    _mutate("[2^64 2^64] same atom", a, c3n); u3z(a); }
  { c3_d now_d[2] = {0x1234567890abcdefULL, 0x8000000cce9e0d80ULL};
    u3_noun now = u3i_chubs(2, now_d);
    u3_noun wir = u3nq(c3__d, c3__term, '1', u3_nul);
    u3_noun cad = u3nt(c3__belt, c3__txt, u3nt('h', 'i', u3_nul));
    u3_noun a = u3nc(now, u3nc(wir, cad));
    _mutate("ovum [now /d/term/1 %belt %txt tape-hi]", a, c3n); u3z(a); }
  { u3_noun a = u3nt(42, u3k(b1), 99); _mutate("[42 bob 99]", a, c3n); u3z(a); }
  { u3_noun a = u3nt(u3k(b2), u3k(b2), u3k(b2)); _mutate("[bob bob bob]", a, c3n); u3z(a); }
  u3z(b1);
  u3z(b2);

  fprintf(_out_u, "\n]}\n");
  fclose(_out_u);

  {
    c3_c cmd_c[2100];
    snprintf(cmd_c, sizeof(cmd_c), "rm -rf '%s'", _pier_c);
    if ( system(cmd_c) ) {}
  }
  return 0;
}
