"""models/kernels"""
