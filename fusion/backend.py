"""Phase 9 — your compiler: torch.compile(model, backend="fusion"). (Under construction.)

Run:  uv run python -m fusion.backend
"""


def run(quick: bool = False) -> None:
    print("Phase 9 is under construction.")


if __name__ == "__main__":
    run()
