/*
 * Input to bindgen for halo-fabric-sys: the parts of the libfabric API HALO uses.
 * The generated src/static_fns.c includes this file, so it is also compiled by build.rs.
 */
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
