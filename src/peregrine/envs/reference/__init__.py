"""What the NumPy references share: the seeded streams (`rng`), the float32
math that matches the C build (`pg_math`) and the batch base class (`batch`)."""
