#!/usr/bin/env bash
# Keep one CPU core busy while PID runs (the "loaded machine" of the AdaPLD benches): a Python
# busy loop in 2-second slices, skipped while a one-thread `specviz train` job already loads a
# core. Usage: bash experiments/one_core_load.sh PID
while kill -0 "$1" 2>/dev/null; do
  if pgrep -f "specviz train" >/dev/null; then sleep 2
  else python3 -c "import time; t=time.time()
while time.time()-t<2: pass"; fi
done
