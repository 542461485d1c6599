"""Policy models and token sampling."""
