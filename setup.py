"""Nebula: one model trained across remote clusters over a slow, untrusted WAN."""
from setuptools import find_packages, setup

setup(
    name="nebula",
    version="0.1.0",
    description="Train one deep learning model across remote clusters through TLS switch servers",
    python_requires=">=3.10",
    packages=find_packages(include=["nebula*", "switch_server*", "security*", "recipes*", "testbed*"]),
    include_package_data=True,
    package_data={"nebula.plan": ["measured.json"]},  # the benchmark's rows `nebula plan` reads by default
    install_requires=[
        "paddlepaddle>=2.6",
        "numpy",
        "cryptography>=41",
        "pyzmq>=25",
        "sentencepiece",
        "PyYAML>=6",
        "scipy",
        "sacrebleu>=2",
        "prometheus-client",
        "matplotlib",
        "dp-accounting>=0.6",
        "gmpy2>=2.1",  # GMP's integers for secure aggregation's Feldman commitments (nebula.federated.secagg.vss)
    ],
    extras_require={
        "test": ["pytest>=7", "hypothesis>=6", "pytest-timeout"],
        # VisualDL scalars beside every recipe's loss.png (nebula.logbook)
        "visualdl": ["visualdl>=2.5"],
        # library models (nebula.formers): PaddleFormers' causal LMs from local checkpoints; its fast_dataindex
        # dependency pins numpy<=1.26.4
        "formers": ["paddleformers==1.2.0", "visualdl>=2.5"],
        # PaddleNLP 2.8.1 (BERT / ERNIE-M bases); it imports with Paddle 3.3.1 only with these older neighbours, which
        # PaddleFormers 1.2.0 excludes (transformers 5 needs huggingface_hub>=1.3, PaddleFormers datasets>=3): install
        # it in an environment without the formers extra
        "nlp": ["paddlenlp==2.8.1", "huggingface_hub<1", "datasets<3", "pyarrow<18", "aistudio-sdk<0.3"],
    },
    entry_points={
        "console_scripts": [
            "nebula=nebula.cli:main",
            "nebula-switch=switch_server.cli:main",
            "nebula-admin=security.cli:main",
        ],
    },
)
