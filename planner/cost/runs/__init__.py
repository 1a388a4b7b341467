"""The trainers' log parsers (``megatron``, ``torchtitan``, ``maxtext``): each reads one trainer's
log lines into numbers. Turning a log into a measured-run row is ``planner.calibration.runs``."""
