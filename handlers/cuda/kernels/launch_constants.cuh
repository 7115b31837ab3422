// The host's launch constants (BLOCK, MID_BLOCK, ... in
// handlers/cuda/launch.py), by which the kernels size their shared
// memory, launch bounds and loops.
//
// Written by `python -m handlers.generate`: do not edit by hand.
#ifndef STREAMHANDLERS_KERNELS_LAUNCH_CONSTANTS_CUH
#define STREAMHANDLERS_KERNELS_LAUNCH_CONSTANTS_CUH

#define SH_BLOCK 256
#define SH_MID_BLOCK 1024
#define SH_SUM_UNROLL 16
#define SH_PICK_UNROLL 16
#define SH_THREAD_ROW 8
#define SH_THREAD_UNROLL 2
#define SH_SHORT_ROW 64
#define SH_LANE_UNROLL 4
#define SH_ROWS_PER_BLOCK 8
#define SH_MAX_BLOCKS_PER_SM 16

#endif
