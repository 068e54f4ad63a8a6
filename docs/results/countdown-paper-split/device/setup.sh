#!/bin/bash
# The first call of a lease, from the repo root with .carry/countdown.json and wheelhouse/ carried:
# the data file where launch.sh and check_chat.py read it, and the wheels.
mkdir -p /root/p /root/runs /root/shared/tools /root/shared/data/countdown
cp .carry/countdown.json /root/countdown.json && cp .carry/countdown.json /root/shared/data/countdown/
[ -f .carry/countdown_check.py ] && cp .carry/countdown_check.py /root/shared/tools/
python3 -m pip install -q --no-index --no-deps wheelhouse/*.whl 2>&1 | tail -2
python3 -c "import torch, transformers, peft; print(torch.__version__, transformers.__version__, peft.__version__, torch.cuda.device_count())"
nvidia-smi -L
