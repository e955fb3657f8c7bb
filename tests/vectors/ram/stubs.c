/* stubs.c: the symbols pkg/noun's manage.c, allocate.c, imprison.c and
**   retrieve.c reference from files this driver does not link (vortex.c,
**   nock.c, jets.c, the jets, libbacktrace, whereami, secp256k1).
**
**   Only one is called, and it does nothing: u3je_secp_init(), from
**   u3m_init()'s crypto set-up (the driver signs nothing).  Every other one
**   aborts loudly if it is ever reached, so a vector can never come out of a
**   stubbed code path.  None is reached: ram, jam, mug and tap only allocate,
**   read and hash nouns (no nock, no jets, no arvo, no snapshot).
*/
#include <stdio.h>
#include <stdlib.h>

/* u3v_Home: the home road's header; vortex.c defines it, u3m_pave() sets it. */
void* u3v_Home = 0;

void u3je_secp_init(void) {}

#define STUB(name) \
  void name(void) { fprintf(stderr, "stub reached: %s\n", #name); abort(); }

/* libbacktrace, whereami: stack traces on a crash */
STUB(backtrace_create_state) STUB(backtrace_pcinfo) STUB(wai_getExecutablePath)
/* secp256k1 shutdown (u3m_stop) */
STUB(u3je_secp_stop)
/* the jet system (jets.c): u3m_boot* and the memory-management walks */
STUB(u3j_boot) STUB(u3j_mark) STUB(u3j_ream) STUB(u3j_reap) STUB(u3j_reclaim)
STUB(u3j_rewrite_compact) STUB(u3j_take)
/* nock (nock.c) */
STUB(u3n_mark) STUB(u3n_nock_on) STUB(u3n_ream) STUB(u3n_reap) STUB(u3n_reclaim)
STUB(u3n_rewrite_compact) STUB(u3n_slam_on) STUB(u3n_take)
/* arvo (vortex.c) and the memo cache (zave.c) */
STUB(u3v_do) STUB(u3v_mark) STUB(u3v_reclaim) STUB(u3v_rewrite_compact) STUB(u3z_reap)
/* jets called by manage.c / retrieve.c / imprison.c helpers the driver never uses */
STUB(u3ka_add) STUB(u3ka_gth) STUB(u3ka_min) STUB(u3ka_sub) STUB(u3kb_flop)
STUB(u3kb_weld) STUB(u3kdb_get) STUB(u3kdb_put) STUB(u3qa_add) STUB(u3qa_gth)
STUB(u3qa_inc) STUB(u3qc_cut) STUB(u3qdb_put) STUB(u3qe_rub)
