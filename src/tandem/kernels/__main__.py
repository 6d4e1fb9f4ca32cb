"""`python -m tandem.kernels`: build (or find) the C kernels for this CPU and say where, or why not.

Exit 0 when they are built, disabled (TANDEM_KERNELS=torch) or impossible here (no C compiler: the
torch paths serve); exit 1 when a compiler is present and the build fails, so `make setup` and
`make test` stop instead of letting every kernel test skip.
"""

from tandem.kernels.build import KernelBuildError, NoCompilerError, build, kernels_enabled


def main() -> int:
    if not kernels_enabled():
        print("tandem C kernels disabled (TANDEM_KERNELS); torch paths will serve")
        return 0
    try:
        print(f"tandem C kernels: {build()}")
    except NoCompilerError as exc:
        print(f"tandem C kernels not built ({exc}); torch paths will serve")
        return 0
    except KernelBuildError as exc:
        print(f"tandem C kernels FAILED to build with a compiler present: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
