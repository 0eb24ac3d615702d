/*
 * pyxis_standin.c -- a TEST STAND-IN for NVIDIA pyxis, for hpcrl's Slurm test cluster.
 *
 * Real pyxis (and enroot under it) cannot run on the CI machine: neither is packaged for
 * Debian and nothing can be fetched. Without pyxis, srun rejects --container-* options
 * ("unrecognized option"), so pyxis-rendered job scripts could not run at all.
 *
 * This SPANK plugin registers pyxis' srun/sbatch/salloc option names and runs NO container.
 * Instead it exports what each task received into the task's environment:
 *
 *   --container-image=foo:1          -> PYXIS_STANDIN_CONTAINER_IMAGE=foo:1
 *   --container-mounts=/a:/b,/c:/d   -> PYXIS_STANDIN_CONTAINER_MOUNTS=/a:/b,/c:/d
 *   --no-container-mount-home        -> PYXIS_STANDIN_NO_CONTAINER_MOUNT_HOME=1
 *
 * so tests can run scripts unchanged and assert on exactly what srun was given.
 *
 * It also makes --container-mounts resolve the way they would in a container, without one:
 * each task gets a private mount namespace in which every SRC:DST[:ro] pair whose SRC and
 * DST both exist is bind-mounted (read-only with ":ro"); nothing leaks to the host. Pairs
 * with a missing side are skipped, not fatal (real pyxis would fail; enroot creates DST
 * inside the image, which would mean a stray directory on the host here). What was
 * actually mounted is exported as PYXIS_STANDIN_BOUND_MOUNTS=SRC:DST[:ro],...
 *
 * An image given as a folder holding etc/environment (tests/standin_image.py builds one: a
 * venv reaching only the heavy packages) changes the task's Python environment as entering a
 * real image would: the host's PYTHONPATH, PYTHONHOME and VIRTUAL_ENV are dropped and every
 * NAME=VALUE line of etc/environment is set, overriding the job's value (pyxis, too, gives a
 * variable the image defines the image's value). Its PATH puts the image's bin first, so
 * `/usr/bin/env python3` runs the image's Python. Any other image name changes nothing.
 *
 * What real pyxis/enroot do that this does not: a separate root filesystem (host paths
 * outside the mounts vanish, the image's /usr and /lib replace the host's), user/mount
 * namespaces and --container-remap-root, the NVIDIA hook (GPU devices, driver libraries),
 * importing and caching images, entrypoints, --container-env. Note that srun resolves a bare
 * command on the host before any of this (pyxis issue 104), here as there.
 *
 * Built by tests/slurm/cluster.sh start:  gcc -shared -fPIC -o pyxis_standin.so pyxis_standin.c
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <slurm/spank.h>

SPANK_PLUGIN(pyxis_standin, 1);

#define ENV_PREFIX "PYXIS_STANDIN_"

static int accept_any(int val, const char *optarg, int remote)
{
    (void)val;
    (void)optarg;
    (void)remote;
    return 0;
}

/* Names and argument arity copied from pyxis' own option table (pyxis_slurm.c). */
static struct spank_option options[] = {
    {"container-image", "[USER@][REGISTRY#]IMAGE[:TAG]|PATH", "[pyxis stand-in] image", 1, 0, accept_any},
    {"container-mounts", "SRC:DST[:FLAGS][,SRC:DST...]", "[pyxis stand-in] bind mounts", 1, 0, accept_any},
    {"container-workdir", "PATH", "[pyxis stand-in] working directory", 1, 0, accept_any},
    {"container-name", "NAME", "[pyxis stand-in] container name", 1, 0, accept_any},
    {"container-env", "NAME[,NAME...]", "[pyxis stand-in] env vars to keep from the host", 1, 0, accept_any},
    {"container-save", "PATH", "[pyxis stand-in] save container state", 1, 0, accept_any},
    {"container-mount-home", NULL, "[pyxis stand-in] bind mount $HOME", 0, 0, accept_any},
    {"no-container-mount-home", NULL, "[pyxis stand-in] do not bind mount $HOME", 0, 0, accept_any},
    {"container-remap-root", NULL, "[pyxis stand-in] become root in the container", 0, 0, accept_any},
    {"no-container-remap-root", NULL, "[pyxis stand-in] do not become root", 0, 0, accept_any},
    {"container-writable", NULL, "[pyxis stand-in] writable container", 0, 0, accept_any},
    {"container-readonly", NULL, "[pyxis stand-in] read-only container", 0, 0, accept_any},
    {"container-entrypoint", NULL, "[pyxis stand-in] run the image entrypoint", 0, 0, accept_any},
    {"no-container-entrypoint", NULL, "[pyxis stand-in] skip the image entrypoint", 0, 0, accept_any},
    SPANK_OPTIONS_TABLE_END,
};

int slurm_spank_init(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    /* Registering here (not via a global spank_options table) also covers sbatch/salloc. */
    for (struct spank_option *opt = options; opt->name != NULL; opt++) {
        if (spank_option_register(sp, opt) != ESPANK_SUCCESS) {
            slurm_error("pyxis_standin: cannot register --%s", opt->name);
            return -1;
        }
    }
    return 0;
}

/* "container-image" -> "PYXIS_STANDIN_CONTAINER_IMAGE" */
static void env_name(const char *option, char *out, size_t size)
{
    size_t n = strlen(ENV_PREFIX);
    snprintf(out, size, "%s", ENV_PREFIX);
    for (const char *c = option; *c != '\0' && n + 1 < size; c++, n++)
        out[n] = *c == '-' ? '_' : (char)toupper((unsigned char)*c);
    out[n] = '\0';
}

static struct spank_option *find_option(const char *name)
{
    for (struct spank_option *opt = options; opt->name != NULL; opt++)
        if (strcmp(opt->name, name) == 0)
            return opt;
    return NULL;
}

static int is_dir_or_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Bind one "SRC:DST[:FLAGS]" pair; 1 if mounted, 0 if skipped, -1 on error. */
static int bind_pair(char *pair, int *unshared)
{
    char *src = strtok(pair, ":");
    char *dst = strtok(NULL, ":");
    char *flags = strtok(NULL, ":");
    if (src == NULL || dst == NULL || !is_dir_or_file(src) || !is_dir_or_file(dst))
        return 0;
    if (!*unshared) {
        /* Private to this task: the host and the other tasks never see these mounts. */
        if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
            slurm_error("pyxis_standin: private mount namespace: %s", strerror(errno));
            return -1;
        }
        *unshared = 1;
    }
    if (mount(src, dst, NULL, MS_BIND | MS_REC, NULL) != 0) {
        slurm_error("pyxis_standin: bind %s on %s: %s", src, dst, strerror(errno));
        return -1;
    }
    if (flags != NULL && strcmp(flags, "ro") == 0
        && mount(NULL, dst, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL) != 0) {
        slurm_error("pyxis_standin: read-only %s: %s", dst, strerror(errno));
        return -1;
    }
    return 1;
}

/* Runs as root in each task's process just after fork, before privileges are dropped. */
int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    char *mounts = NULL;
    if (spank_option_getopt(sp, find_option("container-mounts"), &mounts) != ESPANK_SUCCESS
        || mounts == NULL)
        return 0;
    char *list = strdup(mounts), *save = NULL, bound[4096] = "";
    int unshared = 0, rc = 0;
    for (char *pair = strtok_r(list, ",", &save); pair && rc == 0; pair = strtok_r(NULL, ",", &save)) {
        char copy[1024];
        snprintf(copy, sizeof(copy), "%s", pair);
        int r = bind_pair(pair, &unshared);
        if (r < 0)
            rc = -1;
        else if (r > 0)
            snprintf(bound + strlen(bound), sizeof(bound) - strlen(bound), "%s%s", *bound ? "," : "", copy);
    }
    free(list);
    if (rc == 0 && spank_setenv(sp, ENV_PREFIX "BOUND_MOUNTS", bound, 1) != ESPANK_SUCCESS)
        rc = -1;
    return rc;
}

/* Variables of the host that would point into the host's Python from inside an image. */
static const char *host_python_vars[] = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", NULL};

/* An image folder's etc/environment ("NAME=VALUE" lines) over the task's environment.
 * Returns 0 also when the image is not such a folder (a registry name: nothing to apply). */
static int apply_image_environment(spank_t sp, const char *image)
{
    char path[4096];
    if (image == NULL || image[0] != '/')
        return 0;
    snprintf(path, sizeof(path), "%s/etc/environment", image);
    FILE *file = fopen(path, "r");
    if (file == NULL)
        return 0;
    for (const char **name = host_python_vars; *name != NULL; name++)
        spank_unsetenv(sp, *name);
    char line[8192];
    int rc = 0;
    while (rc == 0 && fgets(line, sizeof(line), file) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        char *equals = strchr(line, '=');
        if (line[0] == '#' || equals == NULL || equals == line)
            continue;
        *equals = '\0';
        if (spank_setenv(sp, line, equals + 1, 1) != ESPANK_SUCCESS) {
            slurm_error("pyxis_standin: cannot set %s from %s", line, path);
            rc = -1;
        }
    }
    fclose(file);
    return rc;
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    char *image = NULL;
    if (spank_option_getopt(sp, find_option("container-image"), &image) == ESPANK_SUCCESS
        && apply_image_environment(sp, image) != 0)
        return -1;
    for (struct spank_option *opt = options; opt->name != NULL; opt++) {
        char *optarg = NULL;
        char name[128];
        if (spank_option_getopt(sp, opt, &optarg) != ESPANK_SUCCESS)
            continue;
        env_name(opt->name, name, sizeof(name));
        const char *value = opt->has_arg ? (optarg ? optarg : "") : "1";
        if (spank_setenv(sp, name, value, 1) != ESPANK_SUCCESS) {
            slurm_error("pyxis_standin: cannot set %s", name);
            return -1;
        }
    }
    return 0;
}
