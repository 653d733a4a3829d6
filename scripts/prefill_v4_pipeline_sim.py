#!/usr/bin/env python3
"""CPU model of prefill v4's producer / consumer mbarrier protocol (attention_prefill_sm90_wgmma_kernel.cuh), to
check the stage and phase bookkeeping without a GPU.

mbarrier model (PTX ISA): a barrier has a current phase number and a pending-arrival count; when the count
reaches zero (and no tx bytes are pending) the phase completes and the next one starts.
try_wait.parity(P) succeeds iff the parity of the *current* (incomplete) phase differs from P, i.e. "the
phase with parity P has completed" -- it cannot tell phase k from phase k - 2.

Actors (Python generators, one step each, interleaved at random): producer thread 0, one representative
producer thread t != 0 (it stands for threads 1..127: every one of them behaves alike), and the consumer
side as one actor (its 8 warps' arrivals counted as one arrival of 8). Stage contents are tracked per row
class ("row 0", written by thread 0, and "rows 1..127"); the check: when the consumer reads stage s for tile
j, both row classes hold tile j, and no write ever lands in a stage the consumer is reading.

Usage: prefill_v4_pipeline_sim.py [--fixed] [--kv N] [--stages S] [--trials T]
"""
import argparse
import random


class Bar:
    def __init__(self, count):
        self.count, self.pending, self.phase = count, count, 0

    def arrive(self, n=1):
        self.pending -= n
        assert self.pending >= 0
        if self.pending == 0:
            self.phase += 1
            self.pending = self.count

    def try_wait(self, parity):
        return (self.phase & 1) != parity


def run(kv_len, S, fixed, rng, kBN=128):
    n_tiles = (kv_len - 1) // kBN + 1  # a 1-row query: its position is kv_len - 1
    full_k = [Bar(1) for _ in range(S)]
    empty_k = [Bar(8) for _ in range(S)]
    # K stage contents per row class: the tile whose data it holds (V behaves the same; K shows the fault).
    content = [{"row0": None, "rows": None} for _ in range(S)]
    reading = [None] * S  # tile the consumer is reading from stage s, or None
    errors = []
    named_bar = {"arrived": set(), "gen": 0}

    def write(s, who, j):
        if reading[s] is not None:
            errors.append(f"tile {j}: {who} written into stage {s} while the consumer reads tile {reading[s]}")
        content[s][who] = j

    def wait(bar, parity):
        while not bar.try_wait(parity):
            yield

    def bar_sync(me):
        gen = named_bar["gen"]
        named_bar["arrived"].add(me)
        if len(named_bar["arrived"]) == 2:
            named_bar["arrived"].clear()
            named_bar["gen"] += 1
        while named_bar["gen"] == gen:
            yield

    def producer(t):
        for j in range(n_tiles):
            s, ph = j % S, (j // S) & 1
            if (j + 1) * kBN <= kv_len:  # TMA tile: thread 0 alone
                if t != 0:
                    continue
                yield from wait(empty_k[s], ph ^ 1)
                full_k[s].pending += 0  # arrive.expect_tx; the TMA lands "later": model it as now
                yield
                write(s, "row0", j)
                write(s, "rows", j)
                full_k[s].arrive()
            else:  # gathered tile: every producer thread writes its own row
                if fixed:
                    if t == 0:
                        yield from wait(empty_k[s], ph ^ 1)
                    yield from bar_sync(t)
                else:
                    yield from wait(empty_k[s], ph ^ 1)
                write(s, "row0" if t == 0 else "rows", j)
                yield
                yield from bar_sync(t)
                if t == 0:
                    full_k[s].arrive()

    def consumer():
        for j in range(n_tiles):
            s = j % S
            yield from wait(full_k[s], (j // S) & 1)
            reading[s] = j
            got = dict(content[s])
            if got["row0"] != j or got["rows"] != j:
                errors.append(f"tile {j} (stage {s}) read with row 0 from tile {got['row0']}, "
                              f"rows 1..127 from tile {got['rows']}")
            for _ in range(rng.randint(1, 6)):  # S = Q K^T in flight
                yield
            reading[s] = None
            empty_k[s].arrive(8)

    actors = [producer(0), producer(1), consumer()]
    steps = 0
    while actors:
        a = rng.choice(actors)
        try:
            next(a)
        except StopIteration:
            actors.remove(a)
        steps += 1
        if steps > 100000:
            errors.append("deadlock")
            break
    return errors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixed", action="store_true", help="model the fixed protocol")
    ap.add_argument("--kv", type=int, nargs="*", default=[17, 300, 513, 672, 1000, 4100])
    ap.add_argument("--stages", type=int, nargs="*", default=[2, 4])
    ap.add_argument("--trials", type=int, default=200)
    a = ap.parse_args()
    rng = random.Random(1)
    bad_total = 0
    for S in a.stages:
        for kv in a.kv:
            bad = [e for _ in range(a.trials) for e in run(kv, S, a.fixed, rng)[:1]]
            bad_total += len(bad)
            print(f"S {S} kv_len {kv:5d}: {len(bad)} of {a.trials} schedules wrong" +
                  (f"; e.g. {bad[0]}" if bad else ""))
    return 1 if bad_total else 0


if __name__ == "__main__":
    raise SystemExit(main())
