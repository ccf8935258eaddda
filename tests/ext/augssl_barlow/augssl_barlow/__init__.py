"""Barlow Twins, a uniformity plug-in, a generated dataset (blobs) and an evaluation (spread) for augssl, from a
package of their own (docs/extending.md)."""
