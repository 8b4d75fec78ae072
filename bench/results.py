#!/usr/bin/env python3
"""One benchmark tool's JSON on stdin as result records on stdout.

bench/cpu.sh and bench/gpu.sh collect every measurement as one JSON line,
{"model", "engine", "test", "tps", "sd"}, and print their tables from those
lines. This turns each tool's own output into them, so that the scripts
share one reading of each format (standard library only: it also runs on
the GPU machine's system Python).

    llama-bench -o json ... | results.py llama-bench MODEL ENGINE
    mlx_lm_bench.py ...     | results.py mlx-lm MODEL ENGINE PP TG
    mlxcel bench --json ... | results.py mlxcel MODEL ENGINE
"""

import json
import statistics
import sys


def record(model, engine, test, tps, sd):
    print(json.dumps({"model": model, "engine": engine, "test": test, "tps": tps, "sd": sd}))


def llama_bench(model, engine):
    # One object per test; a prompt test has n_prompt > 0 and n_gen 0.
    for r in json.load(sys.stdin):
        test = "pp%d" % r["n_prompt"] if r["n_prompt"] else "tg%d" % r["n_gen"]
        record(model, engine, test, r["avg_ts"], r["stddev_ts"])


def mlx_lm(model, engine, pp, tg):
    # bench/mlx_lm_bench.py: {"pp": [rates...], "tg": [rates...]}, one rate a repetition.
    r = json.load(sys.stdin)
    for test, rates in ((f"pp{pp}", r["pp"]), (f"tg{tg}", r["tg"])):
        if rates:
            sd = statistics.stdev(rates) if len(rates) > 1 else 0.0
            record(model, engine, test, statistics.mean(rates), sd)


def mlxcel(model, engine):
    for r in json.load(sys.stdin):
        record(model, engine, r["test"], r["tokens_per_second"], r["stddev"])


def main(argv):
    usage = __doc__.strip().splitlines()[-3:]
    readers = {"llama-bench": (llama_bench, 2), "mlx-lm": (mlx_lm, 4), "mlxcel": (mlxcel, 2)}
    if len(argv) < 2 or argv[1] not in readers or len(argv) - 2 != readers[argv[1]][1]:
        print("usage:\n" + "\n".join(usage), file=sys.stderr)
        return 2
    reader, _ = readers[argv[1]]
    reader(*argv[2:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
