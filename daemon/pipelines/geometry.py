"""Plane geometry for zones and lines: the point of a box that stands for it, a point in a polygon,
the side of a line a point is on, and whether a path passes a line segment.

Coordinates are fractions of the frame (x right, y down, 0 to 1), as zones and lines are written.
"""

from __future__ import annotations

from typing import Sequence

Point = tuple[float, float]


def anchor(box: Sequence[Sequence[float]], width: int, height: int) -> Point:
    """The bottom centre of a box (its corners in pixels) in fractions of a `width` x `height` frame:
    where a person's feet or a car's wheels touch the ground, so that a zone drawn on the ground holds
    what stands on it, however tall it is."""
    xs = [float(p[0]) for p in box]
    ys = [float(p[1]) for p in box]
    return ((min(xs) + max(xs)) / 2 / width, max(ys) / height)


def inside(point: Point, polygon: Sequence[Point]) -> bool:
    """Whether `point` is inside `polygon` (even-odd rule: a self-crossing polygon's overlaps are out).
    A point on an edge may fall either way: a zone's inertia keeps that from flapping."""
    x, y = point
    found = False
    j = len(polygon) - 1
    for i, (xi, yi) in enumerate(polygon):
        xj, yj = polygon[j]
        if (yi > y) != (yj > y) and x < (xj - xi) * (y - yi) / (yj - yi) + xi:
            found = not found
        j = i
    return found


def side(point: Point, a: Point, b: Point) -> float:
    """The signed distance of `point` from the line through a and b: positive on its right as seen on
    the image walking from a to b (y grows downwards), negative on its left."""
    dx, dy = b[0] - a[0], b[1] - a[1]
    length = (dx * dx + dy * dy) ** 0.5
    return (dx * (point[1] - a[1]) - dy * (point[0] - a[0])) / length


def passes(p: Point, q: Point, a: Point, b: Point) -> bool:
    """Whether the path from p to q passes the segment from a to b: where it meets the line through
    them lies between a and b (ends included). p and q are on opposite sides of that line."""
    rx, ry = q[0] - p[0], q[1] - p[1]
    sx, sy = b[0] - a[0], b[1] - a[1]
    denominator = rx * sy - ry * sx
    if denominator == 0:  # parallel: it never passes
        return False
    along = ((a[0] - p[0]) * ry - (a[1] - p[1]) * rx) / denominator  # where on a-b, 0 to 1
    return 0.0 <= along <= 1.0
