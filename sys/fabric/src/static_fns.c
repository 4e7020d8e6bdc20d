#include "wrapper.h"

// Static wrappers

struct fi_info * fi_allocinfo__extern(void) { return fi_allocinfo(); }
int fi_close__extern(struct fid *fid) { return fi_close(fid); }
int fi_control__extern(struct fid *fid, int command, void *arg) { return fi_control(fid, command, arg); }
int fi_trywait__extern(struct fid_fabric *fabric, struct fid **fids, int count) { return fi_trywait(fabric, fids, count); }
int fi_wait__extern(struct fid_wait *waitset, int timeout) { return fi_wait(waitset, timeout); }
ssize_t fi_cq_read__extern(struct fid_cq *cq, void *buf, size_t count) { return fi_cq_read(cq, buf, count); }
ssize_t fi_cq_readfrom__extern(struct fid_cq *cq, void *buf, size_t count, fi_addr_t *src_addr) { return fi_cq_readfrom(cq, buf, count, src_addr); }
ssize_t fi_cq_readerr__extern(struct fid_cq *cq, struct fi_cq_err_entry *buf, uint64_t flags) { return fi_cq_readerr(cq, buf, flags); }
ssize_t fi_cq_sread__extern(struct fid_cq *cq, void *buf, size_t count, const void *cond, int timeout) { return fi_cq_sread(cq, buf, count, cond, timeout); }
int fi_cq_signal__extern(struct fid_cq *cq) { return fi_cq_signal(cq); }
const char * fi_cq_strerror__extern(struct fid_cq *cq, int prov_errno, const void *err_data, char *buf, size_t len) { return fi_cq_strerror(cq, prov_errno, err_data, buf, len); }
int fi_domain__extern(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **domain, void *context) { return fi_domain(fabric, info, domain, context); }
int fi_cq_open__extern(struct fid_domain *domain, struct fi_cq_attr *attr, struct fid_cq **cq, void *context) { return fi_cq_open(domain, attr, cq, context); }
int fi_wait_open__extern(struct fid_fabric *fabric, struct fi_wait_attr *attr, struct fid_wait **waitset) { return fi_wait_open(fabric, attr, waitset); }
int fi_mr_reg__extern(struct fid_domain *domain, const void *buf, size_t len, uint64_t acs, uint64_t offset, uint64_t requested_key, uint64_t flags, struct fid_mr **mr, void *context) { return fi_mr_reg(domain, buf, len, acs, offset, requested_key, flags, mr, context); }
int fi_mr_regv__extern(struct fid_domain *domain, const struct iovec *iov, size_t count, uint64_t acs, uint64_t offset, uint64_t requested_key, uint64_t flags, struct fid_mr **mr, void *context) { return fi_mr_regv(domain, iov, count, acs, offset, requested_key, flags, mr, context); }
int fi_mr_regattr__extern(struct fid_domain *domain, const struct fi_mr_attr *attr, uint64_t flags, struct fid_mr **mr) { return fi_mr_regattr(domain, attr, flags, mr); }
void * fi_mr_desc__extern(struct fid_mr *mr) { return fi_mr_desc(mr); }
uint64_t fi_mr_key__extern(struct fid_mr *mr) { return fi_mr_key(mr); }
int fi_mr_bind__extern(struct fid_mr *mr, struct fid *bfid, uint64_t flags) { return fi_mr_bind(mr, bfid, flags); }
int fi_mr_enable__extern(struct fid_mr *mr) { return fi_mr_enable(mr); }
int fi_av_open__extern(struct fid_domain *domain, struct fi_av_attr *attr, struct fid_av **av, void *context) { return fi_av_open(domain, attr, av, context); }
int fi_av_insert__extern(struct fid_av *av, const void *addr, size_t count, fi_addr_t *fi_addr, uint64_t flags, void *context) { return fi_av_insert(av, addr, count, fi_addr, flags, context); }
int fi_av_remove__extern(struct fid_av *av, fi_addr_t *fi_addr, size_t count, uint64_t flags) { return fi_av_remove(av, fi_addr, count, flags); }
int fi_av_lookup__extern(struct fid_av *av, fi_addr_t fi_addr, void *addr, size_t *addrlen) { return fi_av_lookup(av, fi_addr, addr, addrlen); }
const char * fi_av_straddr__extern(struct fid_av *av, const void *addr, char *buf, size_t *len) { return fi_av_straddr(av, addr, buf, len); }
int fi_endpoint__extern(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep, void *context) { return fi_endpoint(domain, info, ep, context); }
int fi_ep_bind__extern(struct fid_ep *ep, struct fid *bfid, uint64_t flags) { return fi_ep_bind(ep, bfid, flags); }
int fi_enable__extern(struct fid_ep *ep) { return fi_enable(ep); }
ssize_t fi_cancel__extern(fid_t fid, void *context) { return fi_cancel(fid, context); }
int fi_setopt__extern(fid_t fid, int level, int optname, const void *optval, size_t optlen) { return fi_setopt(fid, level, optname, optval, optlen); }
int fi_getopt__extern(fid_t fid, int level, int optname, void *optval, size_t *optlen) { return fi_getopt(fid, level, optname, optval, optlen); }
ssize_t fi_recv__extern(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src_addr, void *context) { return fi_recv(ep, buf, len, desc, src_addr, context); }
ssize_t fi_recvv__extern(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t src_addr, void *context) { return fi_recvv(ep, iov, desc, count, src_addr, context); }
ssize_t fi_send__extern(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest_addr, void *context) { return fi_send(ep, buf, len, desc, dest_addr, context); }
ssize_t fi_sendv__extern(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t dest_addr, void *context) { return fi_sendv(ep, iov, desc, count, dest_addr, context); }
ssize_t fi_inject__extern(struct fid_ep *ep, const void *buf, size_t len, fi_addr_t dest_addr) { return fi_inject(ep, buf, len, dest_addr); }
int fi_getname__extern(fid_t fid, void *addr, size_t *addrlen) { return fi_getname(fid, addr, addrlen); }
ssize_t fi_trecv__extern(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src_addr, uint64_t tag, uint64_t ignore, void *context) { return fi_trecv(ep, buf, len, desc, src_addr, tag, ignore, context); }
ssize_t fi_trecvv__extern(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t src_addr, uint64_t tag, uint64_t ignore, void *context) { return fi_trecvv(ep, iov, desc, count, src_addr, tag, ignore, context); }
ssize_t fi_trecvmsg__extern(struct fid_ep *ep, const struct fi_msg_tagged *msg, uint64_t flags) { return fi_trecvmsg(ep, msg, flags); }
ssize_t fi_tsend__extern(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest_addr, uint64_t tag, void *context) { return fi_tsend(ep, buf, len, desc, dest_addr, tag, context); }
ssize_t fi_tsendv__extern(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t dest_addr, uint64_t tag, void *context) { return fi_tsendv(ep, iov, desc, count, dest_addr, tag, context); }
ssize_t fi_tsendmsg__extern(struct fid_ep *ep, const struct fi_msg_tagged *msg, uint64_t flags) { return fi_tsendmsg(ep, msg, flags); }
ssize_t fi_tinject__extern(struct fid_ep *ep, const void *buf, size_t len, fi_addr_t dest_addr, uint64_t tag) { return fi_tinject(ep, buf, len, dest_addr, tag); }
ssize_t fi_tsenddata__extern(struct fid_ep *ep, const void *buf, size_t len, void *desc, uint64_t data, fi_addr_t dest_addr, uint64_t tag, void *context) { return fi_tsenddata(ep, buf, len, desc, data, dest_addr, tag, context); }
