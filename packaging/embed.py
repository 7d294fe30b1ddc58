#!/usr/bin/env python3
"""Refreshes the copies of config/*.toml and systemd/*.service that
packaging/install.sh carries (a `curl | sh` script has no repository to read
from). tests/install.rs fails when they drift; run this to bring them back:

    python3 packaging/embed.py
"""
import pathlib
import re

root = pathlib.Path(__file__).resolve().parent.parent
script = root / "packaging" / "install.sh"
text = script.read_text()
for src in ["config/server.toml", "config/agent.toml",
            "systemd/gpuq-server.service", "systemd/gpuq-agent.service"]:
    body = (root / src).read_text()
    pattern = re.compile(
        r"(# " + re.escape(src) + r"\n[^\n]*\(\) \{\n    cat <<'GPUQ_EOF'\n)(.*?)(GPUQ_EOF\n)",
        re.S,
    )
    text, n = pattern.subn(lambda m: m.group(1) + body + m.group(3), text)
    if n != 1:
        raise SystemExit(f"install.sh has no embedded copy of {src}")
script.write_text(text)
