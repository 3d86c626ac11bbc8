/* Kineto JSON -> columns, in one pass, with no Python object per event.
 *
 * Hand-written because no library does it: msgspec (the fallback, sptrace/load/decode.py) must
 * build a Python object per event, which is most of what a cold load costs; pyarrow.json and
 * DuckDB reject Kineto's mixed types ("pid": "Spans" among integers) and are slower on one
 * document (benchmarks/bench_load.py). This decoder handles what Kineto writes and declines
 * everything else: `decode(data)` returns None for any input it is not sure to read exactly as
 * the msgspec path would (invalid JSON, an unexpected type, a duplicated key, an escaped key, a
 * time with an exponent or more than three significant decimals, an int beyond 64 bits, invalid
 * UTF-8), and the caller then takes that path, which reads the trace or says what is wrong.
 *
 * It reads a document in pieces as it inflates (`Decoder.feed`), so that a rank's text is never held
 * whole: each piece is parsed up to its last complete event, and the rest waits for the next piece.
 * What it keeps of the text (distinct tokens) it copies. `decode(data)` reads one whole document.
 *
 * Output (a dict): "n" events in file order; "ph" (int8 codes X=0 i=1 s=2 f=3 M=4); "ts", "dur"
 * and integer fields as int64 bytes with INT64_MIN for absent or null; string and raw-JSON fields
 * as (int32 codes, [distinct JSON tokens]) with -1 for absent or null (the values are buffers the
 * caller reads with numpy, owned by the decoder's memory, never copied); "meta" the [(row, args
 * token)] of M events; "top" the [(key, value token)] of the top-level object but traceEvents.
 * A column no event carries is absent from the dict. The caller decodes distinct tokens only.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mremap */
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ABSENT INT64_MIN

/* Column buffers straight from the kernel where it allows: a page costs memory once written, a
 * buffer grows and shrinks without a copy (mremap), and a freed one goes back at once (malloc
 * keeps up to tens of MB of freed heap, a third of a small trace's table, after the load). Under
 * AddressSanitizer they are malloc's, whose bounds it checks (benchmarks/fuzz_native.py). */
#if defined(__linux__) && !defined(__SANITIZE_ADDRESS__)
#include <sys/mman.h>
static void *pages(size_t size) {
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}
static void *pages_resize(void *p, size_t old, size_t size) {
    void *q = mremap(p, old, size, MREMAP_MAYMOVE);
    return q == MAP_FAILED ? NULL : q;
}
static void pages_free(void *p, size_t size) {
    if (p) munmap(p, size);
}
#else
static void *pages(size_t size) { return malloc(size); }
static void *pages_resize(void *p, size_t old, size_t size) { return (void)old, realloc(p, size); }
static void pages_free(void *p, size_t size) { (void)size, free(p); }
#endif
#define MAX_DEPTH 512

/* ---- columns ---------------------------------------------------------------------------- */

typedef struct {
    const char *ptr;
    uint32_t len;
    uint64_t hash;
} Token;

typedef struct { /* distinct tokens of a string column, by open addressing */
    uint32_t *slots; /* 0 = empty, else token index + 1 */
    size_t cap;
    Token *tokens;
    size_t count, tcap;
} Intern;

enum { K_INT, K_STR, K_RAW }; /* int64 value; string (or null); any JSON value kept as text */

typedef struct {
    const char *key; /* JSON key, as written */
    const char *out; /* name in the output dict */
    int kind;
    void *data; /* int64_t* or int32_t*, allocated on first use */
    size_t filled; /* rows [0, filled) hold a value or absent; the rest is not yet touched */
    Intern intern;
} Column;

/* the tokens' bytes, copied out of the text in blocks (the text goes piece by piece) */
typedef struct Block {
    struct Block *next;
    size_t used, cap;
    char data[];
} Block;

/* event-level columns */
enum { C_NAME, C_CAT, C_TS, C_DUR, C_PID, C_TID, C_ID, C_BP, C_PID_S, C_TID_S, C_ID_S, N_EVENT_COLS };

static const char *EVENT_OUT[N_EVENT_COLS] = {"name", "cat", "ts", "dur", "pid", "tid", "id", "bp",
                                              "pid_s", "tid_s", "id_s"};
static const int EVENT_KIND[N_EVENT_COLS] = {K_STR, K_STR, K_INT, K_INT, K_INT, K_INT, K_INT, K_STR,
                                             K_STR, K_STR, K_STR};

/* args of X events (sptrace.load.decode._XArgs) and of i events (_IArgs); "Ev Idx" is in both */
typedef struct {
    const char *key, *out;
    int kind;
    size_t len; /* strlen(key), set at import */
} ArgSpec;

static ArgSpec X_ARGS[] = {
    {"External id", "external_id", K_INT},      {"external id", "external_id_old", K_INT},
    {"correlation", "correlation", K_INT},      {"Sequence number", "seq_num", K_INT},
    {"Fwd thread id", "fwd_thread_id", K_INT},  {"Input Dims", "input_dims", K_RAW},
    {"Input type", "input_types", K_RAW},       {"Concrete Inputs", "concrete_inputs", K_RAW},
    {"Collective name", "coll_name", K_STR},    {"dtype", "coll_dtype", K_STR},
    {"In msg nelems", "in_nelems", K_INT},      {"Out msg nelems", "out_nelems", K_INT},
    {"Group size", "group_size", K_INT},        {"In split size", "in_split", K_RAW},
    {"Out split size", "out_split", K_RAW},     {"Process Group Name", "pg_name", K_RAW},
    {"Process Group Description", "pg_desc", K_STR}, {"Process Group Ranks", "pg_ranks", K_RAW},
    {"Rank", "comm_rank", K_INT},               {"Seq", "comm_seq", K_INT},
    {"Python id", "python_id", K_INT},          {"Python parent id", "python_parent_id", K_INT},
    {"stream", "stream", K_INT},                {"device", "device", K_INT},
    {"Ev Idx", "ev_idx", K_INT},
};
#define N_X_ARGS (sizeof(X_ARGS) / sizeof(X_ARGS[0]))

static ArgSpec I_ARGS[] = {
    {"Addr", "mem_addr", K_INT},
    {"Bytes", "mem_bytes", K_INT},
    {"Total Allocated", "mem_total_allocated", K_INT},
    {"Total Reserved", "mem_total_reserved", K_INT},
    {"Device Type", "device_type", K_INT},
    {"Device Id", "device_id", K_INT},
    {"Ev Idx", "ev_idx", K_INT},
};
#define N_I_ARGS (sizeof(I_ARGS) / sizeof(I_ARGS[0]))
#define N_ARG_COLS (N_X_ARGS + N_I_ARGS - 1) /* ev_idx shared */
#define I_EV_IDX (N_X_ARGS - 1)

/* Tokens a document holds once or a few times (an M event's args, a top-level key and value),
 * noted in C as they are read, copied (``keep``): a piece is read without calling Python, so with
 * the GIL released (another thread imports or maps meanwhile), and they become Python objects in
 * ``finish``. */
typedef struct {
    size_t row;         /* an M event's row; unused for a top-level key */
    const char *a, *b;  /* the token (a key: with b, its value's) */
    size_t a_len, b_len;
} Note;

typedef struct {
    Note *items;
    size_t count, cap;
} Noted;

typedef struct {
    const char *p, *start, *end;
    int fail;
    size_t n, cap;
    int8_t *ph;
    Column ev[N_EVENT_COLS];
    Column args[N_ARG_COLS];
    int i_map[N_I_ARGS]; /* I_ARGS[k] -> args column */
    Noted meta; /* (row, args token) of each M event */
    Block *blocks;
    Intern **added; /* the interns a token was added to since the current event began, in order */
    size_t n_added, cap_added;
} P;

#define BLOCK_SIZE (1u << 20)


/* a copy of n bytes, kept until the decoder goes */
static const char *keep(P *s, const char *a, size_t n) {
    Block *b = s->blocks;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > BLOCK_SIZE ? n : BLOCK_SIZE;
        Block *fresh = malloc(sizeof(Block) + cap);
        if (!fresh) return NULL;
        fresh->used = 0;
        fresh->cap = cap;
        if (b && n > BLOCK_SIZE) { /* a large token gets its own block, behind the current one */
            fresh->next = b->next;
            b->next = fresh;
        } else {
            fresh->next = b;
            s->blocks = fresh;
        }
        b = fresh;
    }
    char *out = b->data + b->used;
    memcpy(out, a, n);
    b->used += n;
    return out;
}

/* a hash of a token, 8 bytes a step (names of templated kernels run to hundreds of bytes) */
/* one more token (two for a key and its value), copied; 0 when out of memory */
static int note(P *s, Noted *l, size_t row, const char *a, size_t a_len, const char *b, size_t b_len) {
    if (l->count == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        Note *items = realloc(l->items, cap * sizeof(Note));
        if (!items) return s->fail = 1, 0;
        l->items = items, l->cap = cap;
    }
    const char *ka = keep(s, a, a_len), *kb = b_len ? keep(s, b, b_len) : NULL;
    if (!ka || (b_len && !kb)) return s->fail = 1, 0;
    l->items[l->count++] = (Note){row, ka, kb, a_len, b_len};
    return 1;
}

static uint64_t hash(const char *s, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ n, w;
    for (; n >= 8; s += 8, n -= 8) {
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDULL;
        h ^= h >> 32;
    }
    w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ULL;
    return h ^ (h >> 29);
}

static int intern_grow(Intern *t) {
    size_t cap = t->cap ? t->cap * 2 : 64;
    uint32_t *slots = calloc(cap, sizeof(uint32_t));
    if (!slots) return -1;
    for (size_t i = 0; i < t->count; i++) {
        size_t j = t->tokens[i].hash & (cap - 1);
        while (slots[j]) j = (j + 1) & (cap - 1);
        slots[j] = (uint32_t)(i + 1);
    }
    free(t->slots);
    t->slots = slots;
    t->cap = cap;
    return 0;
}

/* the token's code, added (its bytes copied) when new; -1 on allocation failure */
static int32_t intern(P *s, Intern *t, const char *a, size_t n) {
    if ((t->count + 1) * 2 > t->cap && intern_grow(t) < 0) return -1;
    uint64_t h = hash(a, n);
    size_t j = h & (t->cap - 1);
    while (t->slots[j]) {
        Token *k = &t->tokens[t->slots[j] - 1];
        if (k->hash == h && k->len == n && memcmp(k->ptr, a, n) == 0) return (int32_t)(t->slots[j] - 1);
        j = (j + 1) & (t->cap - 1);
    }
    if (t->count == t->tcap) {
        size_t tcap = t->tcap ? t->tcap * 2 : 64;
        Token *tokens = realloc(t->tokens, tcap * sizeof(Token));
        if (!tokens) return -1;
        t->tokens = tokens;
        t->tcap = tcap;
    }
    if (s->n_added == s->cap_added) {
        size_t cap = s->cap_added ? s->cap_added * 2 : 64;
        Intern **added = realloc(s->added, cap * sizeof(Intern *));
        if (!added) return -1;
        s->added = added;
        s->cap_added = cap;
    }
    if (n > UINT32_MAX || t->count >= INT32_MAX) return -1;
    const char *copy = keep(s, a, n);
    if (!copy) return -1;
    t->tokens[t->count] = (Token){copy, (uint32_t)n, h};
    t->slots[j] = (uint32_t)(t->count + 1);
    s->added[s->n_added++] = t;
    return (int32_t)t->count++;
}

/* forget the tokens added since the event began (it is read again from the next piece): the
 * latest first, which leaves each probe sequence as it was before they came */
static void intern_undo(P *s) {
    while (s->n_added) {
        Intern *t = s->added[--s->n_added];
        size_t i = --t->count;
        size_t j = t->tokens[i].hash & (t->cap - 1);
        while (t->slots[j] != i + 1) j = (j + 1) & (t->cap - 1);
        t->slots[j] = 0;
    }
}

static size_t width(int kind) { return kind == K_INT ? sizeof(int64_t) : sizeof(int32_t); }

static void fill_absent(Column *c, size_t from, size_t to) {
    if (c->kind == K_INT) {
        int64_t *v = c->data;
        for (size_t i = from; i < to; i++) v[i] = ABSENT;
    } else {
        memset((int32_t *)c->data + from, 0xff, (to - from) * sizeof(int32_t)); /* -1 */
    }
}

/* row r's cell of column c: the column allocated on first use, the rows before r that no event
 * wrote marked absent as they are passed (untouched pages cost no memory); NULL when out of memory */
static void *cell(P *s, Column *c, size_t r) {
    if (!c->data) {
        c->data = pages(s->cap * width(c->kind));
        if (!c->data) {
            s->fail = 1;
            return NULL;
        }
    }
    if (c->filled <= r) {
        fill_absent(c, c->filled, r + 1);
        c->filled = r + 1;
    }
    return (char *)c->data + r * width(c->kind);
}

static int grow_rows(P *s) {
    size_t cap = s->cap ? s->cap * 2 : 4096;
    int8_t *ph = realloc(s->ph, cap);
    if (!ph) return -1;
    s->ph = ph;
    Column *all[N_EVENT_COLS + N_ARG_COLS];
    for (int i = 0; i < N_EVENT_COLS; i++) all[i] = &s->ev[i];
    for (size_t i = 0; i < N_ARG_COLS; i++) all[N_EVENT_COLS + i] = &s->args[i];
    for (size_t i = 0; i < N_EVENT_COLS + N_ARG_COLS; i++) {
        Column *c = all[i];
        if (!c->data) continue;
        void *d = pages_resize(c->data, s->cap * width(c->kind), cap * width(c->kind));
        if (!d) return -1;
        c->data = d;
    }
    s->cap = cap;
    return 0;
}

/* ---- scanning --------------------------------------------------------------------------- */

static inline void ws(P *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t')) s->p++;
}

static inline int expect(P *s, char c) {
    ws(s);
    if (s->p < s->end && *s->p == c) {
        s->p++;
        return 1;
    }
    return 0;
}

/* bytes 0x80.. that start a valid UTF-8 sequence: its length, else 0 (as Python's decoder) */
static int utf8_len(const unsigned char *p, const unsigned char *end) {
    unsigned c = p[0];
    int n;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c == 0xE0) n = 3, lo = 0xA0;
    else if (c == 0xED) n = 3, hi = 0x9F; /* no UTF-16 surrogates */
    else if (c >= 0xE1 && c <= 0xEF) n = 3;
    else if (c == 0xF0) n = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) n = 4;
    else if (c == 0xF4) n = 4, hi = 0x8F;
    else return 0;
    if (end - p < n) return 0;
    if (p[1] < lo || p[1] > hi) return 0;
    for (int i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF) return 0;
    return n;
}

static unsigned char PLAIN[256]; /* bytes a string holds as they are: not '"', '\\', control or non-ASCII */

/* whether any of 8 bytes is not PLAIN: '"', '\\', a control byte or non-ASCII (a word at a time:
 * names and keys are most of a trace's bytes) */
static inline int special8(const unsigned char *p) {
    const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
    uint64_t w, q, b;
    memcpy(&w, p, 8);
    q = w ^ (ones * '"');
    b = w ^ (ones * '\\');
    return (((q - ones) & ~q) | ((b - ones) & ~b) | (w - ones * 0x20) | w) & high ? 1 : 0;
}

static int hexdigit(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* a string at s->p ('"'): its token (with quotes) in [*a, s->p); *escaped when it has escapes */
static int string(P *s, const char **a, int *escaped) {
    const unsigned char *p = (const unsigned char *)s->p, *end = (const unsigned char *)s->end;
    *a = s->p;
    *escaped = 0;
    p++;
    for (;;) {
        while (end - p >= 8 && !special8(p)) p += 8;
        while (p < end && PLAIN[*p]) p++;
        if (p >= end) return 0;
        unsigned c = *p;
        if (c == '"') break;
        if (c == '\\') {
            *escaped = 1;
            if (end - p < 2) return 0;
            char e = (char)p[1];
            if (e == 'u') {
                if (end - p < 6 || !hexdigit(p[2]) || !hexdigit(p[3]) || !hexdigit(p[4]) || !hexdigit(p[5]))
                    return 0;
                p += 6;
            } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' ||
                       e == 't') {
                p += 2;
            } else {
                return 0;
            }
        } else if (c < 0x20) {
            return 0;
        } else {
            int n = utf8_len(p, end);
            if (!n) return 0;
            p += n;
        }
    }
    s->p = (const char *)p + 1;
    return 1;
}

typedef struct {
    int is_int, negative, frac_digits, exponent;
    uint64_t whole;   /* the integer part's magnitude, when it fits (else overflow) */
    int overflow;     /* more than 64 bits in the integer part */
    uint32_t frac3;   /* the first three decimals, as an integer (0..999) */
    int frac_rest;    /* a nonzero decimal after the third */
} Number;

static int number(P *s, Number *n) {
    const char *p = s->p, *end = s->end;
    memset(n, 0, sizeof(*n));
    if (p < end && *p == '-') n->negative = 1, p++;
    if (p >= end || *p < '0' || *p > '9') return 0;
    if (*p == '0') {
        p++;
    } else {
        while (p < end && *p >= '0' && *p <= '9') {
            unsigned d = (unsigned)(*p - '0');
            if (n->whole > (UINT64_MAX - d) / 10) n->overflow = 1;
            else n->whole = n->whole * 10 + d;
            p++;
        }
    }
    n->is_int = 1;
    if (p < end && *p == '.') {
        n->is_int = 0;
        p++;
        if (p >= end || *p < '0' || *p > '9') return 0;
        while (p < end && *p >= '0' && *p <= '9') {
            if (n->frac_digits < 3) n->frac3 = n->frac3 * 10 + (uint32_t)(*p - '0');
            else if (*p != '0') n->frac_rest = 1;
            n->frac_digits++;
            p++;
        }
        for (int i = n->frac_digits; i < 3; i++) n->frac3 *= 10;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        n->is_int = 0;
        n->exponent = 1;
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') return 0;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    s->p = p;
    return 1;
}

static int literal(P *s, const char *word, size_t n) {
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0) return 0;
    s->p += n;
    return 1;
}

/* any JSON value, validated and skipped */
static int skip(P *s, int depth) {
    ws(s);
    if (s->p >= s->end || depth > MAX_DEPTH) return 0;
    const char *a;
    int esc;
    Number num;
    switch (*s->p) {
    case '{':
        s->p++;
        if (expect(s, '}')) return 1;
        do {
            ws(s);
            if (s->p >= s->end || *s->p != '"' || !string(s, &a, &esc) || !expect(s, ':') || !skip(s, depth + 1))
                return 0;
        } while (expect(s, ','));
        return expect(s, '}');
    case '[':
        s->p++;
        if (expect(s, ']')) return 1;
        do {
            if (!skip(s, depth + 1)) return 0;
        } while (expect(s, ','));
        return expect(s, ']');
    case '"':
        return string(s, &a, &esc);
    case 't':
        return literal(s, "true", 4);
    case 'f':
        return literal(s, "false", 5);
    case 'n':
        return literal(s, "null", 4);
    default:
        return number(s, &num);
    }
}

/* an int64 from a JSON integer; 0 (decline) for any other value or one beyond 64 bits */
static int int_value(P *s, int64_t *out) {
    Number n;
    if (!number(s, &n) || !n.is_int || n.overflow) return 0;
    if (n.negative) {
        if (n.whole > (uint64_t)INT64_MAX) return 0; /* (INT64_MIN itself reads as absent: declined) */
        *out = -(int64_t)n.whole;
    } else {
        if (n.whole > (uint64_t)INT64_MAX) return 0;
        *out = (int64_t)n.whole;
    }
    return 1;
}

/* a time in microseconds -> nanoseconds, exactly. Declined where the msgspec path reads the
 * times of the whole trace again as text (decode.py, _us_to_ns): an int from 2^53 us, a fraction
 * from 2^43 us; and where it may round (decimals past the third, an exponent) or fail (beyond
 * 2^63 ns). */
static int time_value(P *s, int64_t *out) {
    Number n;
    if (!number(s, &n) || n.exponent || n.overflow || n.frac_rest) return 0;
    if (n.whole >= (1ULL << 53) || (n.frac3 && n.whole >= (1ULL << 43))) return 0;
    int64_t ns = (int64_t)n.whole * 1000 + (int64_t)n.frac3;
    *out = n.negative ? -ns : ns;
    return 1;
}

static int is_null(P *s) {
    ws(s);
    return s->p < s->end && *s->p == 'n' && literal(s, "null", 4);
}

/* a value into column c at row r: ints (or null), strings (or null), or any JSON as text. The
 * column is allocated only once a value was read whole (a piece may end inside one: its event is
 * read again, and a null must leave no column behind) */
static int put(P *s, Column *c, size_t r) {
    ws(s);
    if (s->p >= s->end) return 0;
    if (is_null(s)) {
        return 1; /* absent and null read the same (msgspec: None), and raw null decodes to None */
    }
    if (c->kind == K_INT) {
        int64_t v, *d;
        if (!int_value(s, &v) || !(d = cell(s, c, r))) return 0;
        *d = v;
        return 1;
    }
    const char *a = s->p;
    if (c->kind == K_STR) {
        int esc;
        if (*s->p != '"' || !string(s, &a, &esc)) return 0;
    } else if (!skip(s, 1)) {
        return 0;
    }
    int32_t code = intern(s, &c->intern, a, (size_t)(s->p - a)), *d;
    if (code < 0) return s->fail = 1, 0;
    if (!(d = cell(s, c, r))) return 0;
    *d = code;
    return 1;
}

/* a key (no escapes: an escaped key could spell a known one) and its colon */
static int key(P *s, const char **k, size_t *n) {
    const char *a;
    int esc;
    ws(s);
    if (s->p >= s->end || *s->p != '"' || !string(s, &a, &esc) || esc) return 0;
    *k = a + 1;
    *n = (size_t)(s->p - a) - 2;
    return expect(s, ':');
}

static int key_is(const char *k, size_t n, const char *word) { return strlen(word) == n && memcmp(k, word, n) == 0; }

/* the args object of an X or i event (ph 0 or 1), into row r */
static int args(P *s, int ph, size_t r) {
    if (!expect(s, '{')) return 0;
    if (expect(s, '}')) return 1;
    const ArgSpec *spec = ph == 0 ? X_ARGS : I_ARGS;
    size_t count = ph == 0 ? N_X_ARGS : N_I_ARGS;
    uint64_t seen = 0;
    do {
        const char *k;
        size_t n;
        if (!key(s, &k, &n)) return 0;
        size_t i;
        for (i = 0; i < count; i++)
            if (spec[i].len == n && memcmp(k, spec[i].key, n) == 0) break;
        if (i == count) {
            if (!skip(s, 2)) return 0;
            continue;
        }
        if (seen & (1ULL << i)) return 0; /* a duplicated key */
        seen |= 1ULL << i;
        Column *c = ph == 0 ? &s->args[i] : &s->args[s->i_map[i]];
        if (!put(s, c, r)) return 0;
    } while (expect(s, ','));
    return expect(s, '}');
}

static int ph_code(const char *a, size_t n) { /* the token, quotes included */
    if (n != 3) return -1;
    switch (a[1]) {
    case 'X': return 0;
    case 'i': return 1;
    case 's': return 2;
    case 'f': return 3;
    case 'M': return 4;
    default: return -1;
    }
}

static const char EMPTY_NAME[] = "\"\"";

/* an M event's args token (the caller reads its name or labels) */
static int meta(P *s, size_t r, const char *a) { return note(s, &s->meta, r, a, (size_t)(s->p - a), NULL, 0); }

/* one event field's value into row r (the fields ph decides on are read once ph is known) */
static int field(P *s, int f, size_t r) {
    ws(s);
    if (s->p >= s->end) return 0;
    switch (f) {
    case C_NAME: /* a string */
        return *s->p == '"' && put(s, &s->ev[C_NAME], r);
    case C_CAT: /* a string or null */
    case C_BP:
        return put(s, &s->ev[f], r);
    case C_TS: /* a number or null */
    case C_DUR: {
        if (is_null(s)) return 1;
        int64_t v, *d;
        if (!time_value(s, &v) || !(d = cell(s, &s->ev[f], r))) return 0;
        *d = v;
        return 1;
    }
    default: { /* pid, tid, flow id: an int, a string (read by the caller), or null */
        if (*s->p == '"') return put(s, &s->ev[C_PID_S + (f - C_PID)], r);
        if (is_null(s)) return 1;
        int64_t v, *d;
        if (!int_value(s, &v) || !(d = cell(s, &s->ev[f], r))) return 0;
        *d = v;
        return 1;
    }
    }
}

/* whether phase ph carries field f (or, f == F_ARGS, args sptrace reads) */
#define F_ARGS 100
static int carries(int ph, int f) {
    if (f == C_DUR) return ph == 0;
    if (f == C_ID || f == C_BP) return ph == 2 || ph == 3;
    return 1;
}

static int event(P *s) {
    if (s->n == s->cap && grow_rows(s) < 0) return s->fail = 1, 0;
    size_t r = s->n;
    if (!expect(s, '{')) return 0;
    int ph = -1, named = 0;
    unsigned seen = 0;
    const char *later[N_EVENT_COLS + 1] = {0}; /* fields seen before ph: read once it is known */
    if (!expect(s, '}')) {
        do {
            const char *k;
            size_t n;
            if (!key(s, &k, &n)) return 0;
            int f = -1;
            switch (n) {
            case 2:
                if (k[0] == 'p' && k[1] == 'h') f = 99;
                else if (k[0] == 't' && k[1] == 's') f = C_TS;
                else if (k[0] == 'i' && k[1] == 'd') f = C_ID;
                else if (k[0] == 'b' && k[1] == 'p') f = C_BP;
                break;
            case 3:
                if (memcmp(k, "cat", 3) == 0) f = C_CAT;
                else if (memcmp(k, "dur", 3) == 0) f = C_DUR;
                else if (memcmp(k, "pid", 3) == 0) f = C_PID;
                else if (memcmp(k, "tid", 3) == 0) f = C_TID;
                break;
            case 4:
                if (memcmp(k, "name", 4) == 0) f = C_NAME;
                else if (memcmp(k, "args", 4) == 0) f = F_ARGS;
                break;
            }
            if (f < 0) {
                if (!skip(s, 2)) return 0;
                continue;
            }
            unsigned bit = 1u << (f == 99 ? N_EVENT_COLS : f == F_ARGS ? N_EVENT_COLS + 1 : f);
            if (seen & bit) return 0; /* a duplicated key */
            seen |= bit;
            ws(s);
            if (f == 99) {
                const char *a;
                int esc;
                if (s->p >= s->end || *s->p != '"' || !string(s, &a, &esc)) return 0;
                ph = ph_code(a, (size_t)(s->p - a));
                if (ph < 0) return 0; /* a phase the typed decoder does not know */
                continue;
            }
            if (f == C_NAME) named = 1;
            int slot = f == F_ARGS ? N_EVENT_COLS : f;
            if (ph < 0 && (f == F_ARGS || !carries(0, f) || f == C_DUR)) {
                later[slot] = s->p; /* depends on ph */
                if (!skip(s, 2)) return 0;
            } else if (f == F_ARGS) {
                const char *a = s->p;
                if (ph <= 1) {
                    if (!args(s, ph, r)) return 0;
                } else if (!skip(s, 2) || (ph == 4 && !meta(s, r, a))) {
                    return 0;
                }
            } else if (carries(ph < 0 ? 0 : ph, f)) {
                if (!field(s, f, r)) return 0;
            } else if (!skip(s, 2)) {
                return 0;
            }
        } while (expect(s, ','));
        if (!expect(s, '}')) return 0;
    }
    if (ph < 0) return 0;
    const char *after = s->p;
    for (int f = 0; f <= N_EVENT_COLS; f++) {
        if (!later[f]) continue;
        s->p = later[f];
        if (f == N_EVENT_COLS) {
            if (ph <= 1 && !args(s, ph, r)) return 0;
            if (ph == 4 && !(skip(s, 2) && meta(s, r, later[f]))) return 0;
        } else if (carries(ph, f) && !field(s, f, r)) {
            return 0;
        }
    }
    s->p = after;
    if (!named) { /* msgspec's default: "" */
        int32_t *d = cell(s, &s->ev[C_NAME], r);
        int32_t code = d ? intern(s, &s->ev[C_NAME].intern, EMPTY_NAME, 2) : -1;
        if (code < 0) return s->fail = 1, 0;
        *d = code;
    }
    s->ph[r] = (int8_t)ph;
    s->n++;
    return 1;
}

/* ---- the document, piece by piece ------------------------------------------------------ */

/* Where the reading stands between steps. A step reads one unit (the opening brace; a top-level
 * key with its value; an event; a separator) and the look-ahead that shows the unit is whole; it
 * changes the state only when the unit was read whole. A unit that fails before the last piece
 * is read again from its start with the next piece appended; one longer than MAX_UNIT is not
 * Kineto's, and is declined. */
enum { D_START, D_KEY, D_AFTER, D_EVENTS, D_END };
#define MAX_UNIT ((ptrdiff_t)64 << 20)

typedef struct {
    PyObject_HEAD
    P s;
    int state, have_events, declined, busy, ready;
    Noted top; /* (key, value token) of each top-level key but traceEvents */
} Decoder;

/* the next non-space byte is there (it is not consumed) */
static inline int ahead(P *s) {
    ws(s);
    return s->p < s->end;
}

static int step(Decoder *d) {
    P *s = &d->s;
    switch (d->state) {
    case D_START:
        if (!expect(s, '{') || !ahead(s)) return 0;
        if (*s->p == '}') s->p++, d->state = D_END;
        else d->state = D_KEY;
        return 1;
    case D_KEY: {
        const char *k;
        size_t n;
        if (!key(s, &k, &n)) return 0;
        if (key_is(k, n, "traceEvents")) {
            if (d->have_events || !expect(s, '[') || !ahead(s)) return 0;
            d->have_events = 1;
            if (*s->p == ']') s->p++, d->state = D_AFTER;
            else d->state = D_EVENTS;
            return 1;
        }
        ws(s);
        const char *a = s->p;
        if (!skip(s, 1) || !ahead(s) || (*s->p != ',' && *s->p != '}')) return 0;
        if (!note(s, &d->top, 0, k, n, a, (size_t)(s->p - a))) return 0;
        d->state = D_AFTER;
        return 1;
    }
    case D_AFTER:
        if (!ahead(s)) return 0;
        if (*s->p == ',') d->state = D_KEY;
        else if (*s->p == '}') d->state = D_END;
        else return 0;
        s->p++;
        return 1;
    case D_EVENTS:
        if (!event(s) || !ahead(s)) return 0;
        if (*s->p == ']') d->state = D_AFTER;
        else if (*s->p != ',') return 0;
        s->p++;
        return 1;
    default: /* D_END: nothing but spaces */
        ws(s);
        return s->p == s->end;
    }
}

/* read [buf, buf + len) as far as its last whole unit; the bytes read, or -1 once declined (for
 * good) or on error (an exception set). ``last``: no piece follows, so every unit must be whole
 * and the document complete. Called with the GIL, which it releases while it reads. */
static Py_ssize_t feed_bytes(Decoder *d, const char *buf, Py_ssize_t len, int last) {
    P *s = &d->s;
    if (d->declined) return -1;
    s->p = buf;
    s->end = buf + len;
    PyThreadState *unlocked = PyEval_SaveThread(); /* (nothing below calls Python) */
    int declined = 0, no_memory = 0;
    for (;;) {
        if (d->state == D_END && s->p == s->end) break;
        const char *mark = s->p;
        size_t n = s->n;
        size_t n_meta = s->meta.count, n_top = d->top.count;
        s->n_added = 0;
        if (step(d)) continue;
        if (s->fail) {
            declined = no_memory = 1;
            break;
        }
        s->p = mark; /* the unit is read again from its start, or never */
        s->n = n;
        intern_undo(s);
        s->meta.count = n_meta, d->top.count = n_top;
        declined = last || d->state == D_END || s->end - mark > MAX_UNIT;
        break;
    }
    if (last && !(d->state == D_END && d->have_events)) declined = 1;
    PyEval_RestoreThread(unlocked);
    if (!declined) return (Py_ssize_t)(s->p - buf);
    d->declined = 1;
    if (no_memory) PyErr_NoMemory();
    return -1;
}

/* ---- output: columns as buffers the decoder allocated, handed over without a copy ---------- */

typedef struct {
    PyObject_HEAD
    void *data;
    Py_ssize_t len; /* what it shows */
    size_t mapped;  /* what it holds */
} Buffer;

static void buffer_dealloc(Buffer *b) {
    pages_free(b->data, b->mapped);
    Py_TYPE(b)->tp_free((PyObject *)b);
}

static int buffer_get(Buffer *b, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)b, b->data, b->len, 0, flags); /* (writable: put in order in place) */
}

static PyBufferProcs BUFFER_PROCS = {(getbufferproc)buffer_get, NULL};

static PyTypeObject BufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sptrace.load._kineto.Buffer",
    .tp_basicsize = sizeof(Buffer),
    .tp_dealloc = (destructor)buffer_dealloc,
    .tp_as_buffer = &BUFFER_PROCS,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "a column's values, through the buffer protocol (numpy.frombuffer), writable",
};

static void release(Column *c, size_t cap) {
    pages_free(c->data, cap * width(c->kind));
    free(c->intern.slots);
    free(c->intern.tokens);
    c->data = NULL;
    c->intern = (Intern){0};
}

/* the column's first n rows, its memory handed to a Buffer (shrunk to n rows of its cap) */
static PyObject *take(Column *c, size_t n, size_t cap) {
    if (c->filled < n) {
        fill_absent(c, c->filled, n);
        c->filled = n;
    }
    size_t size = n * width(c->kind), mapped = cap * width(c->kind);
    void *data = c->data;
    c->data = NULL;
    if (!size) {
        pages_free(data, mapped);
        data = NULL;
        mapped = 0;
    } else if (size < mapped) {
        void *shrunk = pages_resize(data, mapped, size);
        if (shrunk) data = shrunk, mapped = size; /* (a failed shrink keeps the larger block) */
    }
    Buffer *b = PyObject_New(Buffer, &BufferType);
    if (!b) {
        pages_free(data, mapped);
        return NULL;
    }
    b->data = data;
    b->len = (Py_ssize_t)size;
    b->mapped = mapped;
    return (PyObject *)b;
}

static int emit(PyObject *out, Column *c, size_t n, size_t cap) {
    if (!c->data) return 0;
    PyObject *values = take(c, n, cap);
    if (!values) return -1;
    PyObject *item = values;
    if (c->kind != K_INT) {
        PyObject *tokens = PyList_New((Py_ssize_t)c->intern.count);
        for (size_t i = 0; tokens && i < c->intern.count; i++) {
            PyObject *t = PyBytes_FromStringAndSize(c->intern.tokens[i].ptr, c->intern.tokens[i].len);
            if (!t) Py_CLEAR(tokens);
            else PyList_SET_ITEM(tokens, (Py_ssize_t)i, t);
        }
        item = tokens ? PyTuple_Pack(2, values, tokens) : NULL;
        Py_DECREF(values);
        Py_XDECREF(tokens);
        if (!item) return -1;
    }
    int rc = PyDict_SetItemString(out, c->out, item);
    Py_DECREF(item);
    return rc;
}

static void forget(Noted *l) {
    free(l->items);
    *l = (Noted){NULL, 0, 0};
}

/* the notes, as Python sees them: (row, token) of M events, (key, value) of top-level keys */
static int emit_notes(PyObject *out, const char *name, const Noted *l, int keyed) {
    PyObject *list = PyList_New((Py_ssize_t)l->count);
    for (size_t i = 0; list && i < l->count; i++) {
        const Note *t = &l->items[i];
        PyObject *item = keyed ? Py_BuildValue("(y#y#)", t->a, (Py_ssize_t)t->a_len, t->b, (Py_ssize_t)t->b_len)
                               : Py_BuildValue("(ny#)", (Py_ssize_t)t->row, t->a, (Py_ssize_t)t->a_len);
        if (!item) Py_CLEAR(list);
        else PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    int rc = list ? PyDict_SetItemString(out, name, list) : -1;
    Py_XDECREF(list);
    return rc;
}

static void clear_state(P *s) {
    for (int i = 0; i < N_EVENT_COLS; i++) release(&s->ev[i], s->cap);
    for (size_t i = 0; i < N_ARG_COLS; i++) release(&s->args[i], s->cap);
    free(s->ph);
    s->ph = NULL;
    free(s->added);
    s->added = NULL;
    s->n_added = s->cap_added = 0;
    while (s->blocks) {
        Block *next = s->blocks->next;
        free(s->blocks);
        s->blocks = next;
    }
    forget(&s->meta);
}

/* ---- the Decoder type --------------------------------------------------------------------- */

static int decoder_init(Decoder *d, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, ":Decoder", kwlist)) return -1;
    if (d->busy) return PyErr_Format(PyExc_RuntimeError, "the decoder is reading a piece in another thread"), -1;
    clear_state(&d->s);
    forget(&d->top);
    P *s = &d->s;
    memset(s, 0, sizeof(*s));
    for (int i = 0; i < N_EVENT_COLS; i++) s->ev[i] = (Column){NULL, EVENT_OUT[i], EVENT_KIND[i], NULL, 0, {0}};
    for (size_t i = 0; i < N_X_ARGS; i++)
        s->args[i] = (Column){X_ARGS[i].key, X_ARGS[i].out, X_ARGS[i].kind, NULL, 0, {0}};
    size_t j = N_X_ARGS; /* i events' own columns follow X's; they share X's "Ev Idx" */
    for (size_t i = 0; i < N_I_ARGS; i++) {
        if (strcmp(I_ARGS[i].out, "ev_idx") == 0) {
            s->i_map[i] = I_EV_IDX;
            continue;
        }
        s->args[j] = (Column){I_ARGS[i].key, I_ARGS[i].out, I_ARGS[i].kind, NULL, 0, {0}};
        s->i_map[i] = (int)j++;
    }
    d->state = D_START;
    d->have_events = d->declined = 0;
    d->ready = 1;
    return 0;
}

static void decoder_dealloc(Decoder *d) {
    clear_state(&d->s);
    forget(&d->top);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

static PyObject *decoder_feed(Decoder *d, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"data", "last", NULL};
    Py_buffer view;
    int last = 0;
    if (!d->ready) return PyErr_Format(PyExc_ValueError, "the decoder was not initialised"), NULL;
    if (d->busy) return PyErr_Format(PyExc_RuntimeError, "the decoder is reading a piece in another thread"), NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*|p:feed", kwlist, &view, &last)) return NULL;
    d->busy = 1;
    Py_ssize_t used = feed_bytes(d, view.buf, view.len, last);
    d->busy = 0;
    PyBuffer_Release(&view);
    if (used < 0 && PyErr_Occurred()) return NULL;
    return PyLong_FromSsize_t(used);
}

/* the columns, once the last piece was read whole; None when declined. The decoder is spent. */
static PyObject *decoder_finish(Decoder *d, PyObject *unused) {
    (void)unused;
    P *s = &d->s;
    PyObject *out = NULL;
    if (d->busy) return PyErr_Format(PyExc_RuntimeError, "the decoder is reading a piece in another thread"), NULL;
    if (d->ready && !d->declined && d->state == D_END && d->have_events) {
        out = PyDict_New();
        int rc = out ? 0 : -1;
        PyObject *count = PyLong_FromSize_t(s->n);
        PyObject *ph = PyBytes_FromStringAndSize((char *)s->ph, (Py_ssize_t)s->n);
        if (!count || !ph) rc = -1;
        if (!rc) rc = PyDict_SetItemString(out, "n", count);
        if (!rc) rc = PyDict_SetItemString(out, "ph", ph);
        Py_XDECREF(count);
        Py_XDECREF(ph);
        if (!rc) rc = emit_notes(out, "meta", &s->meta, 0);
        if (!rc) rc = emit_notes(out, "top", &d->top, 1);
        for (int i = 0; !rc && i < N_EVENT_COLS; i++) rc = emit(out, &s->ev[i], s->n, s->cap), release(&s->ev[i], s->cap);
        for (size_t i = 0; !rc && i < N_ARG_COLS; i++)
            rc = emit(out, &s->args[i], s->n, s->cap), release(&s->args[i], s->cap);
        if (rc) Py_CLEAR(out);
    }
    clear_state(s);
    forget(&d->top);
    d->declined = 1;
    if (out) return out;
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef DECODER_METHODS[] = {
    {"feed", (PyCFunction)(void (*)(void))decoder_feed, METH_VARARGS | METH_KEYWORDS,
     "feed(data, last=False) -> the bytes read (a tail that holds no whole unit waits: pass it again "
     "before the next piece), or -1 once the document is declined"},
    {"finish", (PyCFunction)decoder_finish, METH_NOARGS, "finish() -> dict of columns, or None when declined"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject DecoderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sptrace.load._kineto.Decoder",
    .tp_basicsize = sizeof(Decoder),
    .tp_dealloc = (destructor)decoder_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Decoder(): a Kineto document read in pieces (feed), then its columns (finish)",
    .tp_methods = DECODER_METHODS,
    .tp_init = (initproc)decoder_init,
    .tp_new = PyType_GenericNew,
};

/* one whole document */
static PyObject *decode(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    Decoder *d = (Decoder *)PyObject_CallNoArgs((PyObject *)&DecoderType);
    if (!d) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_ssize_t used = feed_bytes(d, view.buf, view.len, 1);
    PyBuffer_Release(&view);
    PyObject *out = used < 0 && PyErr_Occurred() ? NULL : decoder_finish(d, NULL);
    Py_DECREF(d);
    return out;
}

static PyMethodDef METHODS[] = {
    {"decode", decode, METH_O, "decode(json_bytes) -> dict of columns, or None when declined"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_kineto", NULL, -1, METHODS, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__kineto(void) {
    for (size_t i = 0; i < N_X_ARGS; i++) X_ARGS[i].len = strlen(X_ARGS[i].key);
    for (size_t i = 0; i < N_I_ARGS; i++) I_ARGS[i].len = strlen(I_ARGS[i].key);
    for (int c = 0; c < 256; c++) PLAIN[c] = c >= 0x20 && c < 0x80 && c != '"' && c != '\\';
    if (PyType_Ready(&BufferType) < 0 || PyType_Ready(&DecoderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&MODULE);
    if (!m) return NULL;
    Py_INCREF(&DecoderType);
    if (PyModule_AddObject(m, "Decoder", (PyObject *)&DecoderType) < 0) {
        Py_DECREF(&DecoderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
