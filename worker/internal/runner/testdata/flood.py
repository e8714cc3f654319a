"""Write N MiB to stdout and stderr, half as one unterminated line."""
import os
import sys

mib = int(sys.argv[1])
chunk = b"x" * (1 << 20)
line = (b"y" * 1023) + b"\n"
lines = line * 1024
for i in range(mib):
    fd = 1 if i % 2 == 0 else 2
    data = chunk if i < mib // 2 else lines
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
os.write(1, b"\nflood-end\n")
