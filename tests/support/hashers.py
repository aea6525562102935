"""A quick password hasher for the test process.

Django's PBKDF2 hasher runs 1,000,000 iterations (about 0.5-1 s on this machine); the suite
creates and signs in users hundreds of times. This one writes the same ``pbkdf2_sha256`` hashes
with 1,000 iterations: the console's own processes (Daphne, the controller) verify them with
their default hasher, which reads the iteration count from the hash (and upgrades it on a
successful sign-in), so nothing but the test process changes.
"""

from __future__ import annotations

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class QuickPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1000
