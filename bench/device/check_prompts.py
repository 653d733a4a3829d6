"""check_prompts.py OUT SCALE: the 32 prompts of `bench/device.sh checks`, 10-3000 words (times SCALE) of common
English words, seeded: the same file on every machine."""
import random
import sys

r = random.Random(7)
scale = float(sys.argv[2])
words = "the of and to in is was for on that with as by at from his an were are which this be or have".split()
with open(sys.argv[1], "w") as f:
    for i in range(32):
        n = int(([10, 40, 200, 800, 3000][i % 5] + r.randrange(10)) * scale) + 1
        f.write(" ".join(r.choice(words) for _ in range(n)) + "\n")
