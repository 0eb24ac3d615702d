/*
 * spank_fake.c -- a TEST STAND-IN for Slurm's SPANK host side, to check the pyxis stand-in
 * plugin's task logic without slurmstepd (tests/slurm/test_pyxis_standin_logic.py).
 *
 * Linked with pyxis_standin.c into one program: it plays slurmstepd's part for one task.
 * srun options come from FAKE_SPANK_OPT_<NAME> variables (container-image ->
 * FAKE_SPANK_OPT_CONTAINER_IMAGE); spank_setenv/unsetenv act on this process's environment,
 * which is the task's. After slurm_spank_task_init it execs argv[1..] like the task would, so
 * a test sees exactly the environment and the Python a task would get. What it does not do:
 * the privileged mount namespace step (slurm_spank_task_init_privileged) is not called.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <slurm/spank.h>

int slurm_spank_task_init(spank_t sp, int ac, char **av);

void slurm_error(const char *format, ...)
{
    va_list args;
    va_start(args, format);
    vfprintf(stderr, format, args);
    va_end(args);
    fputc('\n', stderr);
}

spank_err_t spank_option_register(spank_t spank, struct spank_option *opt)
{
    (void)spank;
    (void)opt;
    return ESPANK_SUCCESS;
}

spank_err_t spank_option_getopt(spank_t spank, struct spank_option *opt, char **optarg)
{
    (void)spank;
    char name[256] = "FAKE_SPANK_OPT_";
    size_t n = strlen(name);
    for (const char *c = opt->name; *c != '\0' && n + 1 < sizeof(name); c++, n++)
        name[n] = *c == '-' ? '_' : (char)toupper((unsigned char)*c);
    name[n] = '\0';
    char *value = getenv(name);
    if (value == NULL)
        return ESPANK_ERROR;
    if (optarg != NULL)
        *optarg = value;
    return ESPANK_SUCCESS;
}

spank_err_t spank_setenv(spank_t spank, const char *var, const char *val, int overwrite)
{
    (void)spank;
    return setenv(var, val, overwrite) == 0 ? ESPANK_SUCCESS : ESPANK_ERROR;
}

spank_err_t spank_unsetenv(spank_t spank, const char *var)
{
    (void)spank;
    return unsetenv(var) == 0 ? ESPANK_SUCCESS : ESPANK_ERROR;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s COMMAND [ARGS...]\n", argv[0]);
        return 2;
    }
    if (slurm_spank_task_init(NULL, 0, NULL) != 0)
        return 3;
    execvp(argv[1], argv + 1);
    perror("execvp");
    return 127;
}
