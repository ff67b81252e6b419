// One trivial kernel: the fatbin fixtures only need device code to exist, per architecture.
extern "C" __global__ void transplant_add(float *x, float y) { x[threadIdx.x] += y; }
