// libstdc++'s headers (GCC >= 11 on glibc >= 2.32) read glibc's
// __libc_single_threaded to skip atomic reference counting in single-threaded
// programs. That one symbol, GLIBC_2.32, was all that kept the aarch64 wheel
// from manylinux2014 (glibc 2.17). This hidden definition satisfies those
// references inside the extension only: it says "not single-threaded", so the
// inline code always takes the atomic path, which is correct everywhere (and
// what a multi-threaded program does anyway). Nothing outside _C sees it.
__attribute__((visibility("hidden"))) char __libc_single_threaded = 0;
