#!/usr/bin/env bash
# Start evolm's scorer service (reward + cost over HTTP) for `task=scorer`, in the foreground.
#
# Usage: launchers/scorer.sh [HOST] [PORT] [extra scorer_server options...]
#   HOST  default $SCORER_HOST, else 127.0.0.1 (use 0.0.0.0 to serve other machines)
#   PORT  default $SCORER_PORT, else 8765
#   e.g.  launchers/scorer.sh 127.0.0.1 8765 --rule keywords
#         launchers/scorer.sh 0.0.0.0 8000 --scorer mypackage.models:SafetyScorer
# Then train with: python -m evolm task=scorer task.url=http://HOST:PORT
# $PYTHON picks the interpreter (default: the repo's .venv if present, else python3).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HOST="${1:-${SCORER_HOST:-127.0.0.1}}"
PORT="${2:-${SCORER_PORT:-8765}}"
shift $(( $# < 2 ? $# : 2 ))
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$HERE/.venv/bin/python" ]]; then PYTHON="$HERE/.venv/bin/python"; else PYTHON=python3; fi
fi
exec "$PYTHON" -m evolm.task.scorer.server --host "$HOST" --port "$PORT" "$@"
