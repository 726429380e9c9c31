// attention_backward.cu — Level 5 attention's backward as a translation unit of its own.
//
// attention.cu holds every kernel, the forward's and the backward's, and the launchers. The
// kernels are templates: nvcc turns one into machine code only where a launcher uses it. So
// this file compiles attention.cu again with LEVELS_ATTENTION_BACKWARD_UNIT defined, which
// keeps its backward launcher (levels_attention_bwd) and drops its forward one: the ~140
// backward kernels are compiled here, the ~80 forward ones in attention.cu's own nvcc
// process, and the build runs the two side by side. What it buys: the cold build waited on
// attention.cu alone for its last ~15 s (cuda_kernels/build.py has the figures). What it
// costs: nvcc parses attention.cu twice (about a second of the front end).
//
// Nothing to write here for the assignment: the backward's solution regions are in
// attention.cu.
#define LEVELS_ATTENTION_BACKWARD_UNIT
#include "attention.cu"
#undef LEVELS_ATTENTION_BACKWARD_UNIT
