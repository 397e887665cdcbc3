/* The libzmq calls the compiled reference servers use (echo.c, bare.c).

   They link the libzmq that pyzmq loads (compiled.py finds it), and pyzmq's
   wheels ship that library without zmq.h, so the calls are declared here as
   libzmq's stable C ABI has them: zmq_msg_t is 64 opaque bytes. */
#ifndef INFERMUX_ZMQ_ABI_H
#define INFERMUX_ZMQ_ABI_H
#include <stddef.h>

typedef struct { unsigned char opaque[64]; } zmq_msg_t;
void *zmq_ctx_new(void);
void *zmq_socket(void *context, int type);
int zmq_bind(void *socket, const char *endpoint);
int zmq_close(void *socket);
const char *zmq_strerror(int errnum);
int zmq_errno(void);
int zmq_msg_init(zmq_msg_t *msg);
void *zmq_msg_data(zmq_msg_t *msg);
size_t zmq_msg_size(const zmq_msg_t *msg);
int zmq_msg_more(const zmq_msg_t *msg);
int zmq_msg_recv(zmq_msg_t *msg, void *socket, int flags);
int zmq_msg_send(zmq_msg_t *msg, void *socket, int flags);
int zmq_msg_close(zmq_msg_t *msg);
int zmq_send(void *socket, const void *buf, size_t len, int flags);

enum { ZMQ_ROUTER = 6, ZMQ_SNDMORE = 2 };
#endif
