"""Nebula: one model trained across remote clusters over a slow, untrusted WAN."""
from setuptools import find_packages, setup

setup(
    name="nebula",
    version="0.1.0",
    description="Train one deep learning model across remote clusters through TLS switch servers",
    python_requires=">=3.10",
    packages=find_packages(include=["nebula*", "switch_server*", "security*", "recipes*"]),
    include_package_data=True,
    install_requires=[
        "paddlepaddle>=2.6",
        "numpy",
        "cryptography>=41",
        "pyzmq>=25",
        "sentencepiece",
        "PyYAML>=6",
        "scipy",
        "sacrebleu>=2",
        "tqdm",
        "prometheus-client",
        "matplotlib",
        "dp-accounting>=0.6",
    ],
    extras_require={
        "test": ["pytest>=7", "hypothesis>=6", "pytest-timeout"],
    },
    entry_points={
        "console_scripts": [
            "nebula=nebula.cli:main",
            "nebula-switch=switch_server.cli:main",
            "nebula-admin=security.cli:main",
        ],
    },
)
