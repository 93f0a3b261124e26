"""drafters"""
