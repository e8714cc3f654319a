"""Spawn a sleeping child, ignore SIGTERM, and wait to be killed."""
import signal
import subprocess
import sys
import time

if len(sys.argv) > 1 and sys.argv[1] == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
print("child=%d" % child.pid, flush=True)
print("ready", flush=True)
while True:
    time.sleep(3600)
