"""rl4agents: JAX-native reinforcement learning for multi-turn LLM agents."""

from setuptools import find_packages, setup

setup(
    name="rl4agents",
    version="0.1.0",
    description="One jitted, sharded program for multi-turn RL of language-model agents.",
    long_description=open("README.md").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["rl4agents", "rl4agents.*"]),
    python_requires=">=3.11",
    install_requires=[
        "jax>=0.10.2",
        "flax>=0.12.8",
        "optax>=0.2.8",
        "orbax-checkpoint>=0.12.8",
        "chex>=0.1.92",
        "ml-collections>=1.1.0",
        "absl-py>=2.0",
        "numpy>=2.0",
        "tqdm>=4.60",  # progress bars
        "tensorboardX>=2.6",  # TensorBoard event files without TensorFlow
        "matplotlib>=3.8",  # learning-curve PNGs
    ],
    extras_require={
        "dev": [
            "pytest>=8",
            "pytest-xdist>=3.5",
            "ruff>=0.6",
            "hypothesis>=6.100",
            "filelock>=3.12",  # locks JAX's compilation cache, shared by the test workers
        ],
        # rl4agents.envs.host.TextArenaEnv: TextArena's text games (tests skip without it)
        "host": ["textarena>=0.7.4"],
        # rl4agents.models.hf / hf_tokenizer: local Llama/Qwen checkpoints and tokenizers;
        # torch (CPU wheel, pinned exactly) and transformers build and reload models in tests.
        "hf": [
            "torch==2.13.0",
            "transformers>=5.0",
            "safetensors>=0.8",
            "tokenizers>=0.23",
            "jinja2>=3.1.6",
            # rl4agents.models.gguf (scripts/get_model.py): GGUF files read and dequantized
            # by llama.cpp's `gguf` package, written as Hugging Face folders.
            "gguf>=0.19.0",
        ],
    },
)
