#!/bin/bash
# Stop runs by name, safely: bash stop.sh NAME...   (SIGTERM: each checkpoints and exits 143)
# A `pkill -f hydra.run.dir=...` typed into a `run` call matches that call's own shell, whose
# command line holds the pattern, and kills the call (session 26). This script's command line
# holds only the names, so the pattern below matches the runs alone.
for r in "$@"; do
  pkill -TERM -f "hydra.run.dir=/root/runs/$r( |\$)" && echo "stopped $r" || echo "$r: not running"
done
