"""edges"""
