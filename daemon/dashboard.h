/* dashboard: the HTML page of GET / (see dashboard.c). */
#ifndef MUSTER_DASHBOARD_H
#define MUSTER_DASHBOARD_H

extern const char dashboard_html[];

#endif
