/* The batched serving form's whole run in C (whole.py loads it; docs/serving.md, "The compiled core").

   The same model as drivers.py's `recurrence` driving batched.py's engine, for the runs whole.py hands over (no
   frontend, no client cap): arrivals join the waiting queue at step boundaries, vLLM V1's scheduler forms each step
   (the running requests in order, preempting from the back when the KV blocks run out, then admissions from the
   queue), the verify and the next drafts come from the per-trace tables, the step is priced by the serving profile
   and the meter integrates the queue. Every rule is small.py's row-by-row form, statement for statement, and every
   float operation is the Python's, in its order, in IEEE double without contraction (whole.py compiles with
   -ffp-contract=off), so the results are equal to the last bit; tests/serving/test_whole.py holds them equal.

   It writes what the Python forms write into their books, as logs of int32 columns: each emit (request, step,
   tokens) in the order made, and, only when asked (`records_wanted`: whole.py runs the core a second time when a
   request's records are first read), each verify (request, drafts, accepted, landed, emitted before) and each lookup
   (request, verifies before, drafts); each step's start, end and record; each request's tokens streamed and every
   inter-token latency, as sim/rows/serving.py orders them. whole.py refuses runs whose numbers could pass 2^31. A log
   that would overflow its buffer stops the run (status FULL): the caller runs it again with twice the room. */

#include <math.h>
#include <stdint.h>
#include <string.h>

/* The row of one request: sim/engine/serving/columns.py (whole.py checks the two agree). */
enum {
    RID, PLEN, TLEN, EMIT, COMP, SPEC, K, BLOCKS, STARTED, CAP, TOFF, KNOWN0, NVER,
    DRAFTED, ACCEPTED, AVAIL, POS, UNK, UTAIL, EOS, COLUMNS
};
enum { BUSY, FIRST, FLOATS };

/* Scheduler and policy settings, in this order (whole.py `Core.settings`). */
enum { MAX_NUM_SEQS, MAX_BATCHED, BLOCK_SIZE, MAX_MODEL_LEN, TOTAL_BLOCKS, CHUNKED, MAX_K, KEEP_STEPS, SETTINGS };
/* Profile coefficients, in this order (whole.py `Core.costs`). */
enum { KV_MS, ATTENTION_MS, STEP_MS, SEQUENCE_MS, DRAFT_MS, COSTS };
/* What the run counts, in this order (whole.py reads `counts` in it). */
enum { N_STEPS, N_EMITS, N_VERIFIES, N_LOOKUPS, N_PREEMPTIONS, N_FINISHED, N_ITL, COUNTS };
/* The meter's floats (metrics.py `Meter`), in this order. */
enum { IN_SYSTEM_MS, BATCH_MS, BUSY_MS, CLOCK_MS, METER };
/* The record of each step besides its start and end (metrics.py `StepRecord`). */
enum { R_SEQUENCES, R_TOKENS, R_PREFILL, R_DRAFTS, R_ACCEPTED, R_WAITING, R_RUNNING, RECORD };

enum { OK = 0, FULL = 1, STALLED = 2 };

/* One scheduled request of a step: its place in `running`, the request, new tokens, tokens computed before, a
   prefill chunk (2: its first token is this step's), whether it samples (2: it leaves at the step's end), drafts. */
typedef struct {
    int64_t at, req, tokens, computed, prefill, completes, drafts;
} Entry;

static inline int64_t min2(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max2(int64_t a, int64_t b) { return a > b ? a : b; }

static int64_t blocks_for(const int64_t *s, int64_t tokens) {
    int64_t t = min2(tokens, s[MAX_MODEL_LEN]);
    return (t + s[BLOCK_SIZE] - 1) / s[BLOCK_SIZE]; /* t >= 0: the ceiling of t / block */
}

/* batched.py `_grow`: the blocks for `tokens` tokens, if the free ones cover what the row lacks. */
static int grow(const int64_t *s, int64_t *row, int64_t tokens, int64_t *free_blocks) {
    /* Most steps stay inside the blocks a request holds: ceil(t / block) <= blocks exactly when t <= blocks *
       block, which spares the division. */
    if (min2(tokens, s[MAX_MODEL_LEN]) <= row[BLOCKS] * s[BLOCK_SIZE]) return 1;
    int64_t need = blocks_for(s, tokens) - row[BLOCKS];
    if (need <= 0) return 1;
    if (need > *free_blocks) return 0;
    *free_blocks -= need;
    row[BLOCKS] += need;
    return 1;
}

/* ServingProfile.forward: linear between grid points, the last segment's slope beyond, the first value below. */
static double forward(int64_t n, const int64_t *grid, const double *ms, const double *slopes, int64_t len) {
    int64_t lo = 0, hi = len; /* bisect_right(grid, n) */
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (n < grid[mid]) hi = mid; else lo = mid + 1;
    }
    int64_t i = lo - 1;
    if (i < 0) return ms[0];
    return ms[i] + (double)(n - grid[i]) * slopes[i];
}

int64_t draftlab_serve_core(
    int64_t n_req, const double *arrival_ms, int64_t *rows, double *floats, int64_t *preemptions,
    double *finish_ms, const int64_t *avail_all, const int64_t *match_all, const int64_t *k_at, int64_t k_len,
    const int64_t *s, const double *costs, const int64_t *grid, const double *grid_ms, const double *slopes,
    int64_t grid_len,
    /* work space: n_req each */
    int64_t *running, int64_t *waiting, int64_t *entry_space, int64_t *finished_order,
    /* logs: int32 columns of `log_cap` entries each, in the order the run makes them; the verifies and lookups
       only with `records` (each request's records, which few runs read: whole.py runs again to log them) */
    int64_t log_cap, int32_t *emits, int64_t *itl_at, double *last_end, int64_t *streamed_total, double *itl_ms,
    int64_t records_wanted, int32_t *verifies,
    int32_t *lookups,
    double *step_times, int64_t *records, int64_t step_cap,
    /* integrals */
    int64_t *k_counts, int64_t *k_first, double *by_size, int64_t *size_first, int64_t by_size_len, double *meter,
    int64_t *counts)
{
    int64_t n_running = 0, w_head = 0, w_len = 0, w_cap = n_req + 1;
    int64_t free_blocks = s[TOTAL_BLOCKS], in_system = 0, next = 0, stalls = 0;
    int64_t n_steps = 0, n_emits = 0, n_verifies = 0, n_lookups = 0, n_preempted = 0, n_finished = 0;
    double now = 0.0;
    Entry *entries = (Entry *)entry_space; /* 7 * n_req integers */
    int64_t n_entries = 0;
    const int64_t limit = s[MAX_MODEL_LEN];

    meter[IN_SYSTEM_MS] = 0.0; meter[BATCH_MS] = 0.0; meter[BUSY_MS] = 0.0; meter[CLOCK_MS] = 0.0;

    while (next < n_req || n_running || w_len) {
        /* Client.send_due: every request due by now joins the back of the queue (Meter.arrive). */
        while (next < n_req && arrival_ms[next] <= now) {
            if (now > meter[CLOCK_MS]) {
                meter[IN_SYSTEM_MS] += (double)in_system * (now - meter[CLOCK_MS]);
                meter[CLOCK_MS] = now;
            }
            meter[IN_SYSTEM_MS] += meter[CLOCK_MS] - arrival_ms[next];
            in_system += 1;
            waiting[(w_head + w_len) % w_cap] = next;
            w_len += 1;
            next += 1;
        }

        /* 2. schedule: the running requests in order (small.py's `_running_loop`) */
        int64_t budget = s[MAX_BATCHED];
        int preempted = 0;
        n_entries = 0;
        /* the step's shape (SchedulerOutput.shape), summed as the entries are made */
        int64_t tokens = 0, kv = 0, tt = 0, tc = 0, prefill_tokens = 0, drafts = 0;
        for (int64_t i = 0; i < n_running && budget > 0; i++) {
            int64_t r = running[i];
            int64_t *row = rows + r * COLUMNS;
            int64_t num_tokens = row[PLEN] + row[EMIT];
            int64_t asks = min2(min2(num_tokens + row[SPEC] - row[COMP], budget), limit - row[COMP] - 1);
            if (asks <= 0) continue;
            int self_victim = 0;
            while (!grow(s, row, row[COMP] + asks, &free_blocks)) {
                int64_t victim = running[--n_running];
                int64_t *vrow = rows + victim * COLUMNS;
                free_blocks += vrow[BLOCKS];
                vrow[BLOCKS] = 0; vrow[COMP] = 0; vrow[SPEC] = 0;
                preemptions[victim] += 1;
                n_preempted += 1;
                w_head = (w_head + w_cap - 1) % w_cap; /* to the front of the queue */
                waiting[w_head] = victim;
                w_len += 1;
                preempted = 1;
                if (victim == r) { self_victim = 1; break; }
            }
            if (self_victim) break;
            budget -= asks;
            int decode = row[STARTED] == 1 && row[COMP] == num_tokens - 1;
            int64_t d = decode ? min2(row[SPEC], asks - 1) : 0;
            entries[n_entries].at = i; entries[n_entries].req = r; entries[n_entries].tokens = asks; entries[n_entries].computed = row[COMP];
            entries[n_entries].prefill = !decode; entries[n_entries].completes = row[COMP] + asks >= num_tokens; entries[n_entries].drafts = d;
            n_entries += 1;
            tokens += asks; kv += row[COMP]; tt += asks * asks; tc += asks * row[COMP]; drafts += d;
            if (!decode) prefill_tokens += asks;
            row[SPEC] = 0;
        }
        /* then the waiting queue's admissions (`_admit`), unless the loop preempted */
        if (!preempted) {
            while (w_len && budget > 0 && n_running < s[MAX_NUM_SEQS]) {
                int64_t r = waiting[w_head];
                int64_t *row = rows + r * COLUMNS;
                int64_t num_tokens = row[PLEN] + row[EMIT], computed = row[COMP];
                int64_t asks = num_tokens - computed;
                if (!s[CHUNKED] && asks > budget) break;
                asks = min2(asks, budget);
                if (blocks_for(s, num_tokens) - row[BLOCKS] > free_blocks) break;
                w_head = (w_head + 1) % w_cap;
                w_len -= 1;
                grow(s, row, computed + asks, &free_blocks);
                entries[n_entries].at = n_running; entries[n_entries].req = r; entries[n_entries].tokens = asks; entries[n_entries].computed = computed;
                entries[n_entries].prefill = 1; entries[n_entries].completes = computed + asks >= num_tokens; entries[n_entries].drafts = 0;
                n_entries += 1;
                tokens += asks; kv += computed; tt += asks * asks; tc += asks * computed; prefill_tokens += asks;
                running[n_running++] = r;
                budget -= asks;
            }
        }
        if (!n_entries) {
            if (!n_running && !w_len) {
                if (next < n_req && arrival_ms[next] > now) now = arrival_ms[next]; /* max(now, next arrival) */
            } else if (stalls++) {
                return STALLED; /* drivers.py `_stalled`: the Python form raises it */
            }
            continue;
        }
        stalls = 0;

        /* 3. price it (ServingProfile.step_parts over SchedulerOutput.shape) */
        int64_t pairs = tc + (tt + tokens) / 2;
        double device = forward(tokens, grid, grid_ms, slopes, grid_len) + costs[KV_MS] * (double)kv;
        device = device + costs[ATTENTION_MS] * (double)pairs;
        double host = costs[STEP_MS] + costs[SEQUENCE_MS] * (double)n_entries;
        host = host + costs[DRAFT_MS] * 0.0; /* the step's shape has drafting 0: drafting is priced below */

        /* 4. apply it (small.py `complete_rows`, `verify_list`, `draft_rows`) */
        int64_t waiting_before = w_len, running_before = n_running;
        int64_t accepted_total = 0, going = 0, drafting = 0;
        int64_t k = n_entries < k_len ? k_at[n_entries] : k_at[k_len - 1];
        for (int64_t j = 0; j < n_entries; j++) {
            int64_t *row = rows + entries[j].req * COLUMNS;
            row[COMP] += entries[j].tokens;
            if (!entries[j].completes) continue;
            int64_t d = entries[j].drafts, em = row[EMIT], cap = row[CAP];
            int64_t known = row[KNOWN0] - em;
            int64_t m = match_all[row[TOFF] + em];
            int64_t checked = min2(d, known - 1);
            int64_t kept = min2(checked, m);
            int64_t accepted = min2(min2(d, m), known);
            int64_t reach = min2(kept + 1, row[TLEN] - em);
            int64_t room = cap - em;
            int64_t landed = min2(reach, room);
            int64_t eos = reach <= kept && reach < room;
            int64_t after = em + landed;
            int finished = eos || after >= cap;
            int first = entries[j].prefill && row[STARTED] == 0;
            if (!first) {
                row[NVER] += 1;
                if (records_wanted) {
                    if (n_verifies >= log_cap) return FULL;
                    int32_t *v = verifies + n_verifies;
                    v[0] = (int32_t)row[RID]; v[log_cap] = (int32_t)d; v[2 * log_cap] = (int32_t)accepted;
                    v[3 * log_cap] = (int32_t)landed; v[4 * log_cap] = (int32_t)em;
                }
                n_verifies += 1;
            }
            row[STARTED] = 1;
            row[EMIT] = after;
            row[COMP] = row[PLEN] + after - 1;
            if (finished) {
                row[POS] = em + kept + 1;
                row[EOS] = eos;
            }
            if (checked < d && m > checked) { /* the one-more rule: it verified past what the trace answers */
                row[UNK] += accepted < d;
                row[UTAIL] = 1;
            }
            row[DRAFTED] += d;
            row[ACCEPTED] += accepted;
            accepted_total += accepted;
            if (landed + eos) { /* streamed: a step that streamed nothing is no emit (`Log.nonzero`) */
                if (n_emits >= log_cap) return FULL;
                int32_t *x = emits + n_emits++;
                if (!streamed_total[entries[j].req]) itl_at[entries[j].req] = landed + eos; /* its first emit */
                streamed_total[entries[j].req] += landed + eos;
                x[0] = (int32_t)row[RID]; x[log_cap] = (int32_t)n_steps; x[2 * log_cap] = (int32_t)(landed + eos);
            }
            entries[j].completes = finished ? 2 : 1; /* 2: it leaves at the step's end */
            if (first) entries[j].prefill = 2; /* 2: its first token is this step's */
            if (!finished && s[MAX_K]) { /* `draft_rows`, in the same order as its `going` list */
                int64_t room2 = limit - (row[PLEN] + row[EMIT]) - 1;
                int64_t available = max2(min2(min2(avail_all[row[TOFF] + row[EMIT]], room2), s[MAX_K]), 0);
                row[AVAIL] = available;
                row[K] = min2(room2, k);
                row[SPEC] = min2(available, k);
                drafting += row[K] > 0;
                if (records_wanted) {
                    if (n_lookups >= log_cap) return FULL;
                    int32_t *l = lookups + n_lookups;
                    l[0] = (int32_t)row[RID]; l[log_cap] = (int32_t)row[NVER]; l[2 * log_cap] = (int32_t)row[SPEC];
                }
                n_lookups += 1;
                going += 1;
            }
        }
        if (going) {
            if (k_first[k] < 0) k_first[k] = n_steps;
            k_counts[k] += going;
        }
        double start = now;
        double end = start + device;
        end = end + host;
        double draft_ms = drafting ? costs[DRAFT_MS] * (double)drafting : 0.0;
        if (drafting) end = end + draft_ms;
        if (end > meter[CLOCK_MS]) { /* Meter.account: everyone here now was in the system for the whole step */
            meter[IN_SYSTEM_MS] += (double)in_system * (end - meter[CLOCK_MS]);
            meter[CLOCK_MS] = end;
        }
        int64_t leaving = 0;
        for (int64_t j = 0; j < n_entries; j++) {
            int64_t r = entries[j].req;
            double *f = floats + r * FLOATS;
            f[BUSY] = f[BUSY] + device;
            f[BUSY] = f[BUSY] + host;
            if (drafting) f[BUSY] = f[BUSY] + draft_ms;
            if (entries[j].prefill == 2) f[FIRST] = end;
            if (entries[j].completes == 2) { /* it leaves, in row order (its blocks back) */
                finish_ms[r] = end;
                free_blocks += rows[r * COLUMNS + BLOCKS];
                in_system -= 1;
                finished_order[n_finished++] = r;
                running[entries[j].at] = -1;
                leaving += 1;
            }
        }
        if (leaving) { /* the rest keep their order */
            int64_t kept_rows = 0;
            for (int64_t i = 0; i < n_running; i++) {
                if (running[i] >= 0) running[kept_rows++] = running[i];
            }
            n_running = kept_rows;
        }
        /* Meter.step */
        if (n_steps >= step_cap) return FULL;
        meter[BUSY_MS] += end - start;
        meter[BATCH_MS] += (double)n_entries * (end - start);
        if (n_entries < by_size_len) {
            if (size_first[n_entries] < 0) { size_first[n_entries] = n_steps; by_size[n_entries] = 0.0 + (end - start); }
            else by_size[n_entries] = by_size[n_entries] + (end - start);
        }
        step_times[2 * n_steps] = start;
        step_times[2 * n_steps + 1] = end;
        if (s[KEEP_STEPS]) {
            int64_t *rec = records + RECORD * n_steps;
            rec[R_SEQUENCES] = n_entries; rec[R_TOKENS] = tokens; rec[R_PREFILL] = prefill_tokens;
            rec[R_DRAFTS] = drafts; rec[R_ACCEPTED] = accepted_total; rec[R_WAITING] = waiting_before;
            rec[R_RUNNING] = running_before;
        }
        n_steps += 1;
        now = end;
    }
    /* What sim/rows/serving.py `emitted_and_itls` makes of the emits: each request's tokens streamed, and every
       inter-token latency by request, then emit (the gap from the request's previous emit over the tokens the emit
       streamed, once per token), the same division. Each request's latencies start after the previous request's:
       its tokens but those of its first emit. */
    int64_t n_itl = 0;
    for (int64_t r = 0; r < n_req; r++) {
        int64_t first = itl_at[r]; /* the tokens of its first emit, counted during the run */
        itl_at[r] = n_itl;
        n_itl += streamed_total[r] - first;
    }
    /* NaN: no emit yet (a step's end may be any number: a profile's grid may fall, and its slope beyond it) */
    for (int64_t r = 0; r < n_req; r++) last_end[r] = NAN;
    for (int64_t i = 0; i < n_emits; i++) {
        int64_t r = emits[i], count = emits[2 * log_cap + i];
        double end = step_times[2 * emits[log_cap + i] + 1];
        if (!isnan(last_end[r])) {
            double gap = (end - last_end[r]) / (double)count;
            double *to = itl_ms + itl_at[r];
            for (int64_t c = 0; c < count; c++) to[c] = gap;
            itl_at[r] += count;
        }
        last_end[r] = end;
    }
    counts[N_STEPS] = n_steps; counts[N_EMITS] = n_emits; counts[N_VERIFIES] = n_verifies;
    counts[N_LOOKUPS] = n_lookups; counts[N_PREEMPTIONS] = n_preempted; counts[N_FINISHED] = n_finished;
    counts[N_ITL] = n_itl;
    return OK;
}
