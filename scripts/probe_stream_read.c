/* What one core reads from DRAM: 192 MB summed (vpsadbw) with k interleaved
 * streams (k = 1, 2, 4, 8: the buffer's k parts read side by side), on 4 KiB
 * pages (argument 0) or 2 MiB pages (argument 1: MADV_HUGEPAGE), best of 6
 * each. The probe scripts/bench_bytes.py compares each decode GEMV with
 * (docs/benchmarks.md#where-a-decode-steps-bytes-go); AVX-512 (Zen 4, Ice
 * Lake and later).
 *
 *     gcc -O3 -march=native -o /tmp/probe_stream_read scripts/probe_stream_read.c
 *     /tmp/probe_stream_read 0 && /tmp/probe_stream_read 1
 *
 * At -O2 the accumulators stay in memory, and one stream then measures that
 * store-to-load chain (17.8 GB/s on Zen 4, against 31-34 at -O3).
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static uint64_t rd(const uint8_t*p,size_t n,int k){ // k interleaved streams over n bytes
 size_t part=n/k; __m512i acc[8]; for(int s=0;s<8;s++)acc[s]=_mm512_setzero_si512();
 for(size_t i=0;i<part;i+=64){for(int s=0;s<k;s++)acc[s]=_mm512_add_epi64(acc[s],_mm512_sad_epu8(_mm512_load_si512(p+s*part+i),_mm512_setzero_si512()));}
 uint64_t t=0;for(int s=0;s<k;s++)t+=_mm512_reduce_add_epi64(acc[s]);return t;}
int main(int c,char**v){size_t n=(size_t)192<<20;int huge=c>1&&atoi(v[1]);
 uint8_t*p=aligned_alloc(2<<20,n);if(huge)madvise(p,n,MADV_HUGEPAGE);for(size_t i=0;i<n;i++)p[i]=i*7;
 volatile uint64_t s=0;int ks[]={1,2,4,8};
 for(int r=0;r<4;r++){int k=ks[r];double b=1e9;for(int j=0;j<6;j++){double t=now();s+=rd(p,n,k);t=now()-t;if(t<b)b=t;}
  printf("huge=%d streams=%d %.1f GB/s\n",huge,k,n/b/1e9);}return 0;}
