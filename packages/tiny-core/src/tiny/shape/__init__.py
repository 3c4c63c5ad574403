"""Shapes: symbolic integer algebra, strided Views and the ShapeTracker."""
from tiny.shape.shapetracker import ShapeTracker
from tiny.shape.symbolic import Node, NumNode, Variable, sint, sym_infer
from tiny.shape.view import View, strides_for_shape

__all__ = ["ShapeTracker", "View", "strides_for_shape", "Node", "NumNode", "Variable", "sint", "sym_infer"]
