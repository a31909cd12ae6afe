"""How many bad inputs the reliability suite tries, by kind and by the exit it expects.

    .venv/bin/python bench/bad_input_cases.py --save bench/results/bad-input.json

Counts the hand-written cases of ``tests/kernel/test_bad_input.py`` (each group is one row of
docs/benchmarks.md §11) and the generated ones of ``tests/kernel/test_bad_input_props.py``
(hypothesis examples per property). Nothing is run: the suite itself checks each case
(exit status, one ``error:`` line, no traceback, no hang, no secret printed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent.parent / "tests"

GROUPS = {  # row of §11 → the function of tests/kernel/test_bad_input.py that builds its cases
    "prometheus_urls": "_prometheus_urls",
    "numbers": "_numbers",
    "text": "_texts",
    "credentials_and_headers": "_headers_and_secrets",
    "files": "_files",
    "servers_that_fail": "_network",
    "simulate_and_lab": "_simulate_and_lab",
    "agent": "_agent",
    "operator_report_and_more": "_operator_report_and_more",
}


def count() -> dict[str, Any]:
    sys.path.insert(0, str(TESTS))
    import kernel.test_bad_input_props as props
    from support import bad_input as cases  # the tests folder is not a package

    groups = {}
    for row, builder in GROUPS.items():
        built = getattr(cases, builder)()
        groups[row] = {
            "cases": len(built),
            "exit_2": sum(c.code == 2 for c in built),
            "exit_1": sum(c.code == 1 for c in built),
        }
    total = {k: sum(g[k] for g in groups.values()) for k in ("cases", "exit_2", "exit_1")}
    if total["cases"] != len(cases.CASES):
        raise SystemExit(f"the groups hold {total['cases']} cases, CASES {len(cases.CASES)}")
    properties = [name for name in dir(props) if name.startswith("test_")]
    return {
        "command": "bench/bad_input_cases.py",
        "groups": groups,
        "hand_written": total,
        "generated": {
            "properties": len(properties),
            "examples_each": props.EXAMPLES.max_examples,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", type=Path, help="write the counts to this JSON file")
    args = parser.parse_args()
    result = count()
    print(json.dumps(result, indent=1))
    if args.save:
        args.save.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
