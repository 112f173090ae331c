#!/usr/bin/env python3
# usage: salt-prefix-tokens.py HASH_FILE COUNT: writes prefix_tokens and random_tokens here.
"""Prints COUNT wrong tokens whose SHA-256 starts with the first two bytes of the salt of
the argon2 PHC string in the file given (what a timing oracle let an attacker find), and
COUNT random wrong tokens that do not."""
import base64, hashlib, sys, secrets
phc = open(sys.argv[1]).read().strip()
salt_b64 = phc.split("$")[4]
salt = base64.b64decode(salt_b64 + "=" * (-len(salt_b64) % 4))
count = int(sys.argv[2])
found, i = [], 0
while len(found) < count and i < 10_000_000:
    t = f"wrong-{i}"
    if hashlib.sha256(t.encode()).digest()[:2] == salt[:2]:
        found.append(t)
    i += 1
open("prefix_tokens", "w").write("\n".join(found) + "\n")
rand = []
while len(rand) < count:
    t = secrets.token_hex(16)
    if hashlib.sha256(t.encode()).digest()[:2] != salt[:2]:
        rand.append(t)
open("random_tokens", "w").write("\n".join(rand) + "\n")
print(f"{len(found)} salt-prefix tokens after {i} SHA-256")
