"""``make audit``: the pinned dependencies (constraints.txt) against known vulnerabilities.

pip-audit runs from a virtual environment of its own (``.venv/audit-tool``), so that its
dependencies never enter the project's. It asks PyPI's vulnerability data for each pinned
version. Exit status: 0 when nothing known is found, or when the data cannot be reached
(said plainly: a machine without the network is not a failure of the project); 1 when a
pinned version has a known vulnerability.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, ".venv", "audit-tool")
PINS = os.path.join(ROOT, "constraints.txt")


def _tool() -> str | None:
    exe = os.path.join(TOOL, "bin", "pip-audit")
    if os.path.exists(exe):
        return exe
    venv.create(TOOL, with_pip=True)
    done = subprocess.run([os.path.join(TOOL, "bin", "python"), "-m", "pip", "install", "-q",
                           "pip-audit"], capture_output=True, text=True)
    return exe if done.returncode == 0 and os.path.exists(exe) else None


def main() -> int:
    exe = _tool()
    if exe is None:
        print("audit: pip-audit could not be installed (no package index reachable?); "
              "nothing was checked")
        return 0
    done = subprocess.run([exe, "--disable-pip", "--no-deps", "-r", PINS, "-f", "json",
                           "--progress-spinner", "off"], capture_output=True, text=True)
    try:
        deps = json.loads(done.stdout)["dependencies"]
    except (ValueError, KeyError, TypeError):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"audit: the vulnerability data could not be reached ({last}); nothing was "
              "checked")
        return 0
    unchecked = [d["name"] for d in deps if d.get("skip_reason")]
    found = [(d["name"], d["version"], v) for d in deps for v in d.get("vulns") or []]
    for name, version, vuln in found:
        fixes = ", ".join(vuln.get("fix_versions") or []) or "none yet"
        print(f"{name} {version}: {vuln.get('id')} (fixed in: {fixes})")
    checked = len(deps) - len(unchecked)
    print(f"audit: {checked} of {len(deps)} pinned packages checked, "
          f"{len(found)} known vulnerabilit{'y' if len(found) == 1 else 'ies'} found")
    if unchecked:
        shown = ", ".join(unchecked[:8]) + (" ..." if len(unchecked) > 8 else "")
        print(f"audit: no vulnerability data could be reached for {len(unchecked)}: {shown}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
