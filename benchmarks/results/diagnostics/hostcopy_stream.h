/* Forced in front of handlers/_hostcopy.c (cc -include) by stage_copy.py to
 * build a variant whose chunks are copied with non-temporal (streaming)
 * stores: the destination lines are written without being read first, and
 * the staging slot, which the GPU's copy engine reads next, does not
 * displace the caches.  x86-64 only (SSE2); a diagnosis, not the library. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <emmintrin.h>
#include <stdint.h>
#include <string.h>

static void *stream_copy(void *dst, const void *src, size_t n) {
    char *d = (char *)dst;
    const char *s = (const char *)src;
    size_t head = (size_t)(-(uintptr_t)d) & 15;
    if (head > n) head = n;
    __builtin_memcpy(d, s, head);
    d += head, s += head, n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
    _mm_sfence();
    __builtin_memcpy(d, s, n);
    return dst;
}
#define memcpy stream_copy
