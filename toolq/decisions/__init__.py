"""decisions"""
