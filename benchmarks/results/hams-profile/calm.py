"""False failovers under load with no kill (issue 39): ``python
benchmarks/results/hams-profile/calm.py MODE SECONDS HOGS`` from the project root. The
stocks graph under the chaos part's clients, HOGS CPU spinners beside it; prints the members
/admin/state lists as lost meanwhile (any is a false failover), as JSON."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from benchmarks import hams as h  # noqa: E402
from benchmarks import hams_stocks as st  # noqa: E402


def main(mode: str, seconds: float, hogs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = h.Server(st.stocks_config(mode), Path(tmp))
        try:
            st._await_whole(server)
            clients = st._StreamClients(server.url, 3, 4, tag="x")
            with clients:
                calm = st._calm(server, st._Losses(), seconds, hogs)
            print(json.dumps({**calm, "rows": clients.sent,
                              "errors": dict(clients.error_kinds)}))
        finally:
            server.stop()


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]))
