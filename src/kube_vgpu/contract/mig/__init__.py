"""Volcano's dynamic-MIG geometry: the device-config document, its slot arithmetic, and the one
shipped here.
"""
