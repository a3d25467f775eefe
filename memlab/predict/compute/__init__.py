"""compute: how long a step takes on paper.

- ``flops``: FLOPs per step, MFU/HFU and the roofline bound; ``attention_io``: attention's HBM traffic.
"""
