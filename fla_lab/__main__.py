"""`python -m fla_lab doctor | bugs | figures`."""
import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fla_lab")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="versions, device, mode, and a kernel health check")
    sub.add_parser("bugs", help="the catalogue of reproduced bugs, with the file:line of each switch")
    sub.add_parser("figures", help="regenerate the static figures in figures/")
    args = parser.parse_args(argv)
    import fla_lab

    if args.command == "doctor":
        return 0 if fla_lab.doctor() else 1
    if args.command == "bugs":
        fla_lab.bugs.show()
        return 0
    if args.command == "figures":
        from fla_lab import viz

        for path in viz.save_all_figures():
            print(path)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
