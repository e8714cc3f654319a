import os

for k, v in sorted(os.environ.items()):
    print("%s=%s" % (k, v), flush=True)
print("end-of-env", flush=True)
