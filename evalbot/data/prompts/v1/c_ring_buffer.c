/*
 * ring_buffer.c - a single-producer, single-consumer byte ring buffer.
 *
 * The capacity is a power of two so that wrapping is a mask rather than a
 * division. Head and tail are free-running counters; their difference is the
 * number of bytes in use, which stays correct across unsigned overflow.
 * With C11 atomics the producer and consumer may run on different threads
 * without a lock, as long as there is exactly one of each.
 */

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ring {
    uint8_t *data;
    size_t mask;               /* capacity - 1 */
    _Atomic size_t head;       /* next byte to write; owned by the producer */
    _Atomic size_t tail;       /* next byte to read; owned by the consumer */
};

static int is_power_of_two(size_t n) { return n != 0 && (n & (n - 1)) == 0; }

int ring_init(struct ring *r, size_t capacity)
{
    if (!is_power_of_two(capacity))
        return -1;
    r->data = malloc(capacity);
    if (r->data == NULL)
        return -1;
    r->mask = capacity - 1;
    atomic_init(&r->head, 0);
    atomic_init(&r->tail, 0);
    return 0;
}

void ring_free(struct ring *r)
{
    free(r->data);
    r->data = NULL;
}

size_t ring_used(struct ring *r)
{
    size_t head = atomic_load_explicit(&r->head, memory_order_acquire);
    size_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
    return head - tail;
}

size_t ring_free_space(struct ring *r) { return (r->mask + 1) - ring_used(r); }

/* Copy up to len bytes in; returns how many were written (may be fewer if full). */
size_t ring_write(struct ring *r, const void *src, size_t len)
{
    size_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    size_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
    size_t space = (r->mask + 1) - (head - tail);
    if (len > space)
        len = space;

    size_t start = head & r->mask;
    size_t first = r->mask + 1 - start;   /* bytes before the physical end */
    if (first > len)
        first = len;
    memcpy(r->data + start, src, first);
    memcpy(r->data, (const uint8_t *)src + first, len - first);

    /* release: the consumer must see the bytes before it sees the new head */
    atomic_store_explicit(&r->head, head + len, memory_order_release);
    return len;
}

/* Copy up to len bytes out; returns how many were read (may be fewer if empty). */
size_t ring_read(struct ring *r, void *dst, size_t len)
{
    size_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    size_t head = atomic_load_explicit(&r->head, memory_order_acquire);
    size_t avail = head - tail;
    if (len > avail)
        len = avail;

    size_t start = tail & r->mask;
    size_t first = r->mask + 1 - start;
    if (first > len)
        first = len;
    memcpy(dst, r->data + start, first);
    memcpy((uint8_t *)dst + first, r->data, len - first);

    atomic_store_explicit(&r->tail, tail + len, memory_order_release);
    return len;
}

#ifdef RING_SELFTEST
int main(void)
{
    struct ring r;
    char out[64];
    if (ring_init(&r, 16) != 0) {
        fprintf(stderr, "init failed\n");
        return 1;
    }

    size_t n = ring_write(&r, "hello, ", 7);
    n += ring_write(&r, "ring buffer!", 12);      /* only 9 of these fit */
    printf("wrote %zu, used %zu, free %zu\n", n, ring_used(&r), ring_free_space(&r));

    size_t got = ring_read(&r, out, 10);
    out[got] = '\0';
    printf("read %zu: \"%s\"\n", got, out);

    ring_write(&r, "wrap", 4);                    /* crosses the physical end */
    got = ring_read(&r, out, sizeof out - 1);
    out[got] = '\0';
    printf("read %zu: \"%s\"\n", got, out);

    ring_free(&r);
    return 0;
}
#endif
