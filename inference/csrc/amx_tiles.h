/*
 * AMX tile set-up shared by paged_attention.c and amx_linear.c: the per-process permission
 * Linux asks for, and the one tile configuration both use (every tile 16 rows of 64 bytes).
 * Tiles are per thread, and oneDNN loads its own configuration between our calls, so each
 * parallel region configures its threads on entry and releases the tiles on exit.
 */
#ifndef KVGATE_AMX_TILES_H
#define KVGATE_AMX_TILES_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed, aligned(64))) TileConfig;

/* Whether this process may use the tile registers: asked once, remembered in *state
   (0: not asked yet, 1: granted, -1: refused). */
static inline int amx_request(int *state) {
    int s = __atomic_load_n(state, __ATOMIC_ACQUIRE);
    if (s == 0) {
        s = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : -1;
        __atomic_store_n(state, s, __ATOMIC_RELEASE);
    }
    return s > 0;
}

static inline void amx_configure(void) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette_id = 1;
    for (int i = 0; i < 8; i++) {
        c.rows[i] = 16;
        c.colsb[i] = 64;
    }
    _tile_loadconfig(&c);
}
#endif
