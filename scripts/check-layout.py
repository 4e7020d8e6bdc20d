#!/usr/bin/env python3
"""The README's layout table against the tree: every path it names exists, every
workspace member (Cargo.toml) is in it under its package name, and every top-level
folder with code is in it. Exit 1, naming what differs. CI runs it.

    python3 scripts/check-layout.py
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Top-level folders that hold no code of their own or are not part of the layout.
NOT_LAYOUT = {"docs", "scripts", "target", "fuzz", "tests", "benches", ".ci", ".git", "shared"}


def main() -> int:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]+) \|", section, re.M)
    problems = []
    listed = {}
    for path, crate in rows:
        listed[path.rstrip("/")] = crate.strip()
        if not (ROOT / path).exists():
            problems.append(f"README's layout names {path}, which does not exist")
    # (No tomllib: it is Python 3.11+ and this runs on older system Pythons too.)
    members = re.search(r"^members\s*=\s*\[([^\]]*)\]", (ROOT / "Cargo.toml").read_text(), re.M)
    for member in re.findall(r'"([^"]+)"', members.group(1)):
        folder = member
        manifest = (ROOT / member / "Cargo.toml").read_text()
        name = re.search(r'^name\s*=\s*"([^"]+)"', manifest, re.M).group(1)
        crate = listed.get(folder)
        if crate is None:
            problems.append(f"workspace member {member} ({name}) is not in README's layout table")
        elif f"`{name}`" != crate and name not in crate:
            problems.append(f"README's layout says {folder}/ is {crate}, Cargo.toml says {name}")
    for d in sorted(p for p in ROOT.iterdir() if p.is_dir()):
        if d.name in NOT_LAYOUT or d.name.startswith("."):
            continue
        if d.name not in listed and not any(k.startswith(d.name + "/") for k in listed):
            problems.append(f"top-level folder {d.name}/ is not in README's layout table")
    for p in problems:
        print(p)
    print(f"README layout: {len(rows)} rows, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
