#!/bin/bash
# session 8 lease, first call: data, wheels, p0's run (generation-20 checkpoint) and final adapter
bash docs/results/countdown-paper-split/device/setup.sh
mkdir -p /root/runs && tar -xf .carry/p0-run.tar -C /root/runs && ls /root/runs/p0 /root/runs/p0/checkpoints
cp -r .carry/p0-adapter /root/p0-adapter && cp -r .carry/s8 /root/s8 && ls /root/p0-adapter
nproc; df -h /root | tail -1; date +%s
