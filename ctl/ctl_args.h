/* ctl_args: musterctl's command-line options of the GNU form, shared by its commands. */
#ifndef MUSTER_CTL_ARGS_H
#define MUSTER_CTL_ARGS_H

/*
 * The value of "--name VALUE" or "--name=VALUE" at argv[*i] (advancing *i
 * past a separate value); NULL when argv[*i] is another option, or when the
 * value is missing (then *missing is set).
 */
const char *ctl_option_value(int argc, char **argv, int *i, const char *name, int *missing);

#endif
