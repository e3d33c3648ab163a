"""standins"""
