"""Content rules on hostile messages: one send's `Rules.holds` at the spec's bounds.

    .venv/bin/python bench/content_rules.py [--rules 99] [--repeat 20] [--quick]

Builds a spec of `--rules` rules, a third of each kind, each near its bounds (100 keywords, a
pattern that backtracks catastrophically in a backtracking engine, 100 domains) within the 64 KiB
total, and times its validation (apply) and `compile_rules` (once per generation). Then it times
`holds` on messages of the scan's size: plain prose (the baseline), the ReDoS input `a…a!`, text
full of Unicode and punycode hosts, dots, and a message one character past the scan. Each figure
is the median and maximum of `--repeat` runs, and its ratio to the baseline from the same run.
No database or Temporal: the rules are pure.
"""

from __future__ import annotations

import argparse
import statistics
import time

from harness import parse_with_quick, progress, table

from eventos import names
from eventos.spec.content_rules import compile_rules
from eventos.spec.model import load_specs

SCAN = names.RULES_SCAN_MAX_CHARS
REDOS = "'(a+)+$|^(\\w+\\s?)*!$|x{100}y'"


def spec_text(count: int) -> str:
    rules = []
    for i in range(count):
        kind = i % 3
        if kind == 0:
            words = ", ".join(f"k{i}w{j}" for j in range(names.RULE_ITEMS_MAX))
            rules.append(f"{{id: k{i}, kind: keyword, words: [{words}]}}")
        elif kind == 1:
            rules.append(f"{{id: r{i}, kind: regex, pattern: {REDOS}}}")
        else:
            domains = ", ".join(f"s{j}.e{i}.com" for j in range(names.RULE_ITEMS_MAX))
            rules.append(f"{{id: d{i}, kind: domain, domains: [{domains}]}}")
    listed = "".join(f"    - {r}\n" for r in rules)
    return (
        "apiVersion: eventos/v1\nkind: Employee\nmetadata: {name: bench}\nspec:\n"
        "  agents: [{name: a, model: {provider: local, name: scripted}}]\n"
        f"  content_rules:\n{listed}"
    )


def messages() -> dict[str, str]:
    def fill(unit: str) -> str:
        return (unit * (SCAN // len(unit) + 1))[:SCAN]

    return {
        "plain prose (baseline)": fill("we will look into your order today. "),
        "ReDoS a…a!": "a" * (SCAN - 1) + "!",
        "Unicode hosts": " ".join(f"ü{i}.ä{i}.com" for i in range(SCAN // 8))[:SCAN],
        "punycode hosts": " ".join(f"xn--{i}.e1.com" for i in range(SCAN // 8))[:SCAN],
        "dots a.a.a…": fill("a."),
        "keyword near-misses": fill("k0w1x k0w2_ zz. "),  # 16 characters: no cut word
        "one past the scan": fill("plain words ") + "!",
    }


def timed(fn: object, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - started)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", type=int, default=99)
    parser.add_argument("--repeat", type=int, default=20)
    args = parse_with_quick(parser, {"rules": 3, "repeat": 2})
    text = spec_text(args.rules)
    started = time.perf_counter()
    (spec,) = load_specs(text)
    validated = time.perf_counter() - started
    started = time.perf_counter()
    rules = compile_rules(spec.spec.content_rules)
    compiled = time.perf_counter() - started
    print(f"{args.rules} rules, {len(text)} characters of YAML: validation (apply) "
          f"{validated:.3f} s, compile_rules {compiled:.3f} s")  # fmt: skip
    rows = []
    baseline = 0.0
    for name, message in messages().items():
        progress(f"holds: {name}")
        holds = rules.holds("telegram", message, "u1", {"u1"})
        runs = timed(lambda m=message: rules.holds("telegram", m, "u1", {"u1"}), args.repeat)
        median = statistics.median(runs)
        baseline = baseline or median
        rows.append([name, len(message), len(holds), f"{median * 1000:.1f}",
                     f"{max(runs) * 1000:.1f}", f"{median / baseline:.1f}"])  # fmt: skip
    print(f"holds() per message, {args.repeat} runs each")
    print(table(["message", "chars", "holds", "p50 ms", "max ms", "/baseline"], rows))


if __name__ == "__main__":
    main()
