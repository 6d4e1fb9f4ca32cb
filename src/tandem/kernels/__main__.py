"""`python -m tandem.kernels`: build (or find) the C kernels for this CPU and say where, or why not."""

from tandem.kernels.build import KernelBuildError, build


def main() -> int:
    try:
        print(f"tandem C kernels: {build()}")
    except KernelBuildError as exc:
        print(f"tandem C kernels not built ({exc}); torch paths will serve")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
